"""The testbed layout in one place: what the chain writes is what the report reads."""

from __future__ import annotations

import doctest

import pytest

import lightning_unlearn.workflows.lacuna.testbed_layout as layout
from lightning_unlearn.errors import MissingPathError


def test_the_report_starts_from_the_instruction_tuned_model_when_the_chain_tuned_one(tmp_path):
    t = layout.TestbedPaths(tmp_path)  # through the module: pytest would collect names that start with test
    with pytest.raises(MissingPathError, match="lightning-unlearn lacuna run --workdir"):
        layout.testbed_paths(tmp_path)
    for path in (t.pre, t.data, t.inj(), t.inj(unmasked=True)):
        path.mkdir(parents=True)
    t.masks.write_bytes(b"")
    found = layout.testbed_paths(tmp_path)
    assert (found["start"], found["control_start"]) == (t.inj(), t.inj(unmasked=True))
    t.instructed().mkdir(parents=True)
    assert layout.testbed_paths(tmp_path)["start"] == tmp_path / "instruct" / "export" / "model"


def test_the_modules_example_runs():
    result = doctest.testmod(layout)
    assert result.attempted >= 2 and result.failed == 0
