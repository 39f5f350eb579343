"""A bad hyperparameter is refused before the model or tokenizer is read: the message names the value, not a path."""

from __future__ import annotations

import pytest

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.objectives import DPO, NPO, UNDIAL, IdkDPO, SimNPO


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (NPO, {"beta": -1.0}, "NPO beta must be positive, got -1.0"),
        (SimNPO, {"beta": 0.0}, "SimNPO beta must be positive, got 0.0"),
        (UNDIAL, {"strength": -2.0}, "UNDIAL strength must be non-negative, got -2.0"),
        (DPO, {"beta": -0.5}, "DPO beta must be positive, got -0.5"),
        (IdkDPO, {"beta": 0.0}, "IdkDPO beta must be positive, got 0.0"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_a_bad_value_is_refused_before_the_model_directory_is_read(tmp_path, cls, kwargs, message):
    with pytest.raises(ConfigError, match=message):  # the directory does not exist: a later check would say so
        cls(str(tmp_path / "no_such_model"), **kwargs)


def test_a_judge_head_missing_a_field_names_it():
    from lightning_unlearn.labelers.responsiveness_judge import JudgeHead

    head = JudgeHead.from_dict({"coef": [0.5, -1.0], "intercept": 0.1, "threshold": 0.0})
    assert (head.coef, head.intercept, head.threshold) == ((0.5, -1.0), 0.1, 0.0)
    with pytest.raises(ConfigError, match="lacks intercept, threshold; write the file again"):
        JudgeHead.from_dict({"coef": [0.5]})
