"""The package's entry points hide a fixed list of third-party messages and let every other one through."""

import logging

from lightning_unlearn.console import quiet_third_party


def test_quiet_drops_tips_and_absent_accelerators_and_keeps_the_rest(caplog):
    quiet_third_party()
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO):
        for message in (
            "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels]",
            "GPU available: False, used: False",
            "TPU available: False, using: 0 TPU cores",
            "GPU available: True (cuda), used: True",
            "`Trainer.fit` stopped: `max_steps=3` reached.",
        ):
            logger.info(message)
    assert [r.getMessage() for r in caplog.records] == [
        "GPU available: True (cuda), used: True",
        "`Trainer.fit` stopped: `max_steps=3` reached.",
    ]
