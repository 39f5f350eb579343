"""``lightning-unlearn smollm2``: the offline SmolLM2-135M-Instruct subject as a local model directory.

The conversion and the cache live in the library (:mod:`lightning_unlearn.smollm2`); this is only the command.
"""

from __future__ import annotations

from lightning_unlearn.smollm2 import smollm2_path


def smollm2_command(cache_dir: str | None = None) -> str:
    """Convert the packaged SmolLM2-135M-Instruct GGUF to an fp32 model directory once; print its path.

    Args:
        cache_dir: where the converted model lives (default: ``$LIGHTNING_UNLEARN_SMOLLM2_DIR``, else
            ``~/.cache/lightning_unlearn/smollm2-135m-instruct``).
    """
    return str(smollm2_path(cache_dir))


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn smollm2 [--cache_dir DIR]``: see :func:`smollm2_command`."""
    from lightning_unlearn.workflows.command import dispatch

    dispatch(smollm2_command, argv, "lightning-unlearn smollm2")
