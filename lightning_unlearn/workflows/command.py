"""What every non-Trainer command shares: the jsonargparse parser class and how a result is printed.

A command is a typed function whose signature is its schema and whose Google-style docstring is its ``--help``
(first line: the one-line description; ``Args:``: one line per option). Its module's ``main(argv)`` hands it to
``jsonargparse.auto_cli(..., parser_class=CommandParser, prog="lightning-unlearn <name>")`` and prints what it
returns with :func:`print_result`. Required parameters are positional unless keyword-only (after ``*``, a
``--flag``); progress goes to ``logging.getLogger("lightning_unlearn")``, only the result to stdout.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, get_args, get_origin

from jsonargparse import ArgumentParser

from lightning_unlearn.configs.parse_errors import exit_in_one_line
from lightning_unlearn.distributed import world


class CommandParser(ArgumentParser):
    """jsonargparse's parser, except that a positional ``list[X]`` parameter takes one value per word
    (``report RUN_A RUN_B``), like argparse's ``nargs="+"``, instead of one YAML list (``report '[RUN_A, RUN_B]'``).
    A config file still gives it as a list."""

    def add_argument(self, *args, **kwargs):
        """``ArgumentParser.add_argument``, with a positional ``list[X]`` taking one value per word (``nargs="+"``)."""
        hint = getattr(kwargs.get("action"), "_typehint", None)
        if len(args) == 1 and not args[0].startswith("-") and get_origin(hint) is list and len(get_args(hint)) == 1:
            kwargs.pop("action")
            kwargs.update(type=get_args(hint)[0], nargs="+")
        return super().add_argument(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        """One line on stderr naming the key, the value and the fix (``--help`` has the usage), exit status 2."""
        if not self.exit_on_error:
            return super().error(message, ex)
        exit_in_one_line(self, message, ex)


def print_result(result: Any) -> None:
    """Print a command's result: text as it is, anything else as indented JSON, ``None`` not at all. A command that
    ran as several processes (``evaluate`` under DDP / FSDP, whose ranks Lightning started) prints it on rank 0."""
    if result is None or world()[0] != 0:
        return
    print(result if isinstance(result, str) else json.dumps(result, indent=1, ensure_ascii=False))


def dispatch(
    commands: Callable | Mapping[str, Callable], argv: Sequence[str] | None, prog: str, description: str | None = None
) -> None:
    """Parse ``argv`` for one command (a function) or a group (``{name: function}``), run it, print its result."""
    from jsonargparse import auto_cli

    kwargs = {} if description is None else {"description": description}
    print_result(auto_cli(commands, args=argv, parser_class=CommandParser, prog=prog, **kwargs))
