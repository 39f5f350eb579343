"""Read what a run wrote for TensorBoard, with TensorBoard's own event reader (every event kept)."""

from __future__ import annotations

from pathlib import Path


def events(directory: Path):
    """Every event of the TensorBoard run ``directory`` (its own event files, not its subdirectories')."""
    from tensorboard.backend.event_processing.event_accumulator import (
        STORE_EVERYTHING_SIZE_GUIDANCE,
        EventAccumulator,
    )

    accumulator = EventAccumulator(str(directory), size_guidance=STORE_EVERYTHING_SIZE_GUIDANCE)
    accumulator.Reload()
    return accumulator


def session(directory: Path) -> tuple[dict, dict]:
    """The HParams session of the TensorBoard run ``directory``: its hyperparameters and its metrics' last values.
    It is the run's only session (one event file), and no experiment summary fixes the HParams view's columns."""
    from tensorboard.plugins.hparams import metadata

    assert len(list(directory.glob("events.out.tfevents.*"))) == 1
    accumulator = events(directory)
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)
    assert metadata.EXPERIMENT_TAG not in content and metadata.SESSION_END_INFO_TAG in content
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    hparams = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    return hparams, {tag: accumulator.Scalars(tag)[-1].value for tag in accumulator.Tags()["scalars"]}
