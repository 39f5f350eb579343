"""LENS workflows: base answers, annotation round trip, forget sets and calibration (``prepare``, ``validity``), the
trajectory summary (``summary``), re-scoring saved generations (``rescore``) and the whole chain from a suite file
(``run``); :func:`main` is ``lightning-unlearn lens``."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn lens {baseline,export,import,label,calibrate,summary,rescore,run,suite check}``."""
    from lightning_unlearn.workflows.command import dispatch
    from lightning_unlearn.workflows.lens import prepare
    from lightning_unlearn.workflows.lens.rescore import rescore
    from lightning_unlearn.workflows.lens.run import run_command
    from lightning_unlearn.workflows.lens.summary import summary_command

    commands = {
        "baseline": prepare.baseline_command,
        "export": prepare.export_command,
        "import": prepare.import_command,
        "label": prepare.label_command,
        "calibrate": prepare.calibrate_command,
        "summary": summary_command,
        "rescore": rescore,
        "run": run_command,
        "suite": {"check": prepare.suite_check_command},
    }
    description = (
        "LENS steps: base answers, annotation, forget sets, calibration, trajectory summary, rescoring, the whole run."
    )
    dispatch(commands, argv, "lightning-unlearn lens", description)
