"""``lightning-unlearn lacuna <command>``: the testbed chain, each of its steps, and the localization report.

Commands (each a ``*_command`` function beside the step it runs; its signature is the command's options):

- ``run``: the whole chain (:mod:`.chain`); ``data``: the testbed data directory only.
- ``filter``: greedy extraction per field, then the memorization-filtered splits (:mod:`.filter`).
- ``resurface``: the resurfacing attack on a (unlearned) model (:mod:`.resurface`).
- ``locality``: which parameters an injection changed outside a group's mask (:mod:`.locality`).
- ``localization``: localization precision of every method on a built testbed (:mod:`.localization`).
- ``reference``: the retain reference (start model with m^F reset to θ_pre) for forget quality and PrivLeak
  (:mod:`.reference`).

Progress goes to the ``lightning_unlearn`` logger, the result to stdout.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn lacuna {run,data,filter,resurface,locality,localization,reference}``."""
    from lightning_unlearn.workflows.command import dispatch
    from lightning_unlearn.workflows.lacuna.chain import data_command, run_command
    from lightning_unlearn.workflows.lacuna.filter import filter_command
    from lightning_unlearn.workflows.lacuna.locality import locality_command
    from lightning_unlearn.workflows.lacuna.localization import localization_command
    from lightning_unlearn.workflows.lacuna.reference import reference_command
    from lightning_unlearn.workflows.lacuna.resurface import resurface_command

    commands = {
        "run": run_command,
        "data": data_command,
        "filter": filter_command,
        "resurface": resurface_command,
        "locality": locality_command,
        "localization": localization_command,
        "reference": reference_command,
    }
    description = "The Lacuna testbed: the chain, each of its steps, and the localization precision run."
    dispatch(commands, argv, "lightning-unlearn lacuna", description)


__all__ = ["main"]
