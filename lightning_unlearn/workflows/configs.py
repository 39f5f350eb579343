"""``lightning-unlearn configs {list,copy}``: the shipped configs by name (see :mod:`lightning_unlearn.configs`)."""

from __future__ import annotations

from lightning_unlearn.configs import copy_config, list_configs


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn configs {list,copy}``: name the shipped configs, or copy one to edit."""
    from jsonargparse import auto_cli

    def list_(group: str | None = None) -> None:
        """Print every shipped config (``group``: only ``lens``, ``lacuna``, ``trainer`` or ``sweeps``)."""
        for name in list_configs():
            if group is None or name.startswith(f"{group}/"):
                print(name)

    def copy(name: str, destination: str, overwrite: bool = False) -> None:
        """Copy the shipped config NAME (e.g. lens/npo.yaml) to DESTINATION (a file or a folder)."""
        print(copy_config(name, destination, overwrite))

    auto_cli({"list": list_, "copy": copy}, args=argv, as_positional=True, prog="lightning-unlearn configs")
