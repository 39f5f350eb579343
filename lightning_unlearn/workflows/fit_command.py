"""One ``lightning-unlearn fit`` (or ``validate``) that a workflow launches: its configs, overrides, run root and
resume, as a command line and as the recipe recorded beside its result.

The Lacuna chain's stages, the localization report's runs and a sweep's cells are each a :class:`FitCommand`. It
resumes one way: when its root holds a checkpoint, ``--ckpt_path last`` (the CLI resumes from the newest checkpoint
anywhere under the root, :func:`~lightning_unlearn.checkpoints.latest_checkpoint`). Its recipe is the text of its
config files and its overrides (:mod:`~lightning_unlearn.workflows.recipes`): where the configs live and whether the
run resumes do not change the result, so they are not in it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lightning_unlearn.checkpoints import latest_checkpoint
from lightning_unlearn.workflows.recipes import code_digest

PROGRAM = (sys.executable, "-m", "lightning_unlearn.cli")


@dataclass(frozen=True)
class FitCommand:
    """A ``fit`` / ``validate`` of ``configs`` (in order) with ``overrides`` (``--key value`` words), run in ``root``.

    Args:
        configs: the ``-c`` files, later ones over earlier ones.
        root: ``trainer.default_root_dir``: where the run writes, and where a resume looks for its checkpoint.
        overrides: further command-line words (``["--model.init_args.beta", "0.5"]``).
        subcommand: ``fit`` or ``validate``.

    Example::

        >>> from pathlib import Path
        >>> cmd = FitCommand([Path("npo.yaml")], Path("/nonexistent/run"), ["--model.init_args.beta", "0.5"])
        >>> cmd.args()
        ['fit', '-c', 'npo.yaml', '--model.init_args.beta', '0.5', '--trainer.default_root_dir', '/nonexistent/run']
    """

    configs: Sequence[Path]
    root: Path
    overrides: Sequence[str] = field(default_factory=tuple)
    subcommand: str = "fit"

    def __post_init__(self) -> None:
        object.__setattr__(self, "configs", tuple(Path(c) for c in self.configs))
        object.__setattr__(self, "root", Path(self.root))
        object.__setattr__(self, "overrides", tuple(str(o) for o in self.overrides))

    def resumes(self) -> bool:
        """Whether the run resumes: a ``fit`` whose root already holds a checkpoint."""
        return self.subcommand == "fit" and latest_checkpoint(self.root) is not None

    def args(self) -> list[str]:
        """The words after ``lightning-unlearn``: the subcommand, ``-c`` files, overrides, the root, and ``--ckpt_path
        last`` when :meth:`resumes`."""
        args = [self.subcommand]
        for config in self.configs:
            args += ["-c", str(config)]
        args += [*self.overrides, "--trainer.default_root_dir", str(self.root)]
        return [*args, "--ckpt_path", "last"] if self.resumes() else args

    def argv(self) -> list[str]:
        """The whole command line: this Python running ``lightning_unlearn.cli`` with :meth:`args`."""
        return [*PROGRAM, *self.args()]

    def recipe(self, workdir: str | os.PathLike | None = None) -> dict:
        """What the result depends on: the text of the config files, the overrides and the root (paths under
        ``workdir`` written relative to it, so a moved work directory keeps its recipes), and the code (``code``)."""
        words = [*self.overrides, "--trainer.default_root_dir", str(self.root)]
        if workdir is not None:
            words = [w.replace(str(workdir), "<workdir>") for w in words]
        return {"configs": [Path(c).read_text() for c in self.configs], "overrides": words, "code": code_digest()}


__all__ = ["FitCommand"]
