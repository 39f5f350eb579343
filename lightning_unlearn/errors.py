"""The mistakes a user can make, as types: what ``lightning-unlearn`` ends with one line instead of a traceback.

Every check of a config value, a path or a data file in this package raises a :class:`UserError`: one line that names
the problem and the fix. Each concrete class is also the built-in exception a Python caller expects
(:class:`ConfigError` is a ``ValueError``, :class:`MissingPathError` a ``FileNotFoundError``, :class:`PathExistsError`
a ``FileExistsError``), so ``except ValueError`` keeps working. The command line catches :class:`UserError` by type;
anything else is a bug and keeps its traceback.

Example::

    >>> from lightning_unlearn.errors import ConfigError, UserError
    >>> try:
    ...     raise ConfigError("optim.lr must be a positive finite number, got -1; e.g. optim.lr: 1e-5.")
    ... except UserError as err:
    ...     print(isinstance(err, ValueError), err)
    True optim.lr must be a positive finite number, got -1; e.g. optim.lr: 1e-5.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user gave (a config value, a path, a data file): its message is the one line shown."""


class ConfigError(UserError, ValueError):
    """A value the user gave that the tool refuses: a wrong type or range, a shape, a combination."""


class MissingPathError(UserError, FileNotFoundError):
    """A file or directory the user named that does not exist (or lacks what it must hold)."""


class PathExistsError(UserError, FileExistsError):
    """A path the user named that is in the way: an existing file where a directory must be made, or the like."""


__all__ = ["ConfigError", "MissingPathError", "PathExistsError", "UserError"]
