"""Reading a YAML file the user wrote (a config, a sweep file) without changing what it says.

PyYAML keeps the last of two equal keys in a mapping and drops the first without a word: two ``model:`` blocks in
one config train with the second block's values. :func:`read_yaml` refuses that, and reports a file that is not
UTF-8 or not valid YAML, each as one ``ValueError`` naming the file, the line and the fix.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from lightning_unlearn.errors import ConfigError, MissingPathError


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping holding one key twice is an error."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    first: dict[object, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges; its keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            line = first.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:  # an unhashable key: PyYAML's own error says so below
            continue
        if line != key_node.start_mark.line + 1:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} is given twice in one mapping (first on line {line}); YAML would keep only the last "
                "value: merge the two into one",
                key_node.start_mark,
            )
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> object:
    """The content of the YAML file ``path`` (``None`` when empty).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not UTF-8, not valid YAML, or a key given twice in one mapping: ``FILE:LINE:COLUMN: …``.
    """
    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"YAML file {str(p)!r} does not exist.")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{p}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x}); re-save the file as UTF-8."
        ) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "given twice" in problem:
            raise ConfigError(f"{where}: {problem}.") from None
        raise ConfigError(f"{where}: not valid YAML ({problem}); fix the file.") from None
