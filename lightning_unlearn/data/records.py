"""The one reader of prompt/answer records: forget and retain sets, and every evaluation callback's records.

A source is a list of dicts, or a path to:

- a JSONL file (one object a line) or a JSON file (an array of objects, or ``{"data": [...]}``);
- a CSV or Parquet file (read through ``datasets.load_dataset``);
- a ``datasets`` directory written by ``save_to_disk`` (a ``Dataset``, a ``DatasetDict`` or a folder of saved
  splits; ``split`` picks one), or any other local directory ``datasets.load_dataset`` reads (data files, a
  dataset script).

Columns are mapped to ``prompt`` and ``answer`` with ``prompt_key`` / ``answer_key``; the other columns are kept (a
testbed split's ``group_id``). A source without a ``prompt`` column but with ``question`` (TOFU, OpenUnlearning) reads
``question`` as the prompt. TOFU's truth-ratio columns are optional and checked where present:
``paraphrased_answer`` (a string) and ``perturbed_answer`` (a list of strings, the wrong answers); a reader that needs
them names them in ``require``. Errors name the file, the line or row, and the columns there are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from lightning_unlearn.errors import ConfigError, MissingPathError


def meta_path(path: str | Path) -> Path:
    """The metadata sidecar of a records file: ``forget.jsonl`` → ``forget.meta.json``."""
    p = Path(path)
    return p.with_name(p.name.rsplit(".", 1)[0] + ".meta.json") if "." in p.name else p.with_name(p.name + ".meta.json")


def recorded_suites_dir(path: str | Path) -> str | None:
    """The folder of a user's suite that ``lens baseline`` recorded in the ``.meta.json`` of its output ``path``
    (``None``: the shipped suites, or no sidecar)."""
    meta = meta_path(path)
    return json.loads(meta.read_text(encoding="utf-8")).get("suites_dir") if meta.is_file() else None


PROMPT_ALIASES = ("question",)
# TOFU's columns for the truth ratio: the paraphrased true answer and a list of perturbed (wrong) answers
TRUTH_RATIO_COLUMNS = (
    "paraphrased_answer",
    "perturbed_answer",
)  # read as the prompt when prompt_key is the default and the source lacks "prompt"
_LOADERS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def read_records(
    source: Sequence[dict] | str | os.PathLike,
    split: str | None = None,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    what: str = "records",
    require: Sequence[str] = (),
) -> list[dict]:
    """``[{"prompt", "answer", …other columns}]`` from ``source`` (see the module docstring).

    Args:
        source: records, or a path to them.
        split: split of a ``DatasetDict`` or a folder of saved splits (ignored for a single dataset or file).
        prompt_key: column holding the prompt.
        answer_key: column holding the answer.
        what: names the set in error messages (``forget set``, ``retain records``).
        require: further columns every record must have (``TRUTH_RATIO_COLUMNS`` for the truth ratio).

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: a file does not parse, the set is empty, or a record lacks a mapped column.
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source).expanduser()
        if not path.exists():
            raise MissingPathError(
                f"{what} {str(path)!r} does not exist; give a JSONL, JSON, CSV or Parquet file or a datasets folder."
            )
        rows, where = _read_path(path, split), repr(str(path))
    else:
        rows, where = [dict(r) for r in source], "(given as a list)"
    if not rows:
        raise ConfigError(f"the {what} {where} holds no record; give at least one.")
    records = [_mapped(row, i, prompt_key, answer_key, what, where) for i, row in enumerate(rows)]
    for i, record in enumerate(records):
        for column in require:
            if column not in record:
                raise ConfigError(
                    f"{what} record {i} of {where} lacks column {column!r}, which this evaluation needs; it has "
                    f"{sorted(record)}. Add it (TOFU's *_perturbed files have it) or drop the metric that needs it."
                )
        _check_truth_ratio_columns(record, i, what, where)
    return records


def _check_truth_ratio_columns(record: dict, i: int, what: str, where: str) -> None:
    para = record.get("paraphrased_answer")
    if "paraphrased_answer" in record and not (isinstance(para, str) and para.strip()):
        raise ConfigError(
            f"{what} record {i} of {where} has paraphrased_answer={para!r}; it must be a non-empty string."
        )
    if "perturbed_answer" in record:
        pert = record["perturbed_answer"]
        if not (isinstance(pert, list) and pert and all(isinstance(a, str) and a.strip() for a in pert)):
            raise ConfigError(
                f"{what} record {i} of {where} has perturbed_answer={pert!r}; it must be a non-empty list of non-empty "
                "strings (a JSONL/JSON array or a Parquet list column; CSV cannot hold lists)."
            )


def _mapped(row: dict, i: int, prompt_key: str, answer_key: str, what: str, where: str) -> dict:
    if not isinstance(row, dict):
        raise ConfigError(f"{what} record {i} of {where} is a {type(row).__name__}, not an object with columns.")
    key = prompt_key
    if key not in row and key == "prompt":
        key = next((alias for alias in PROMPT_ALIASES if alias in row), key)
    missing = [k for k in (key, answer_key) if k not in row]
    if missing:
        raise ConfigError(
            f"{what} record {i} of {where} lacks column(s) {missing}; it has {sorted(row)}. Name the columns with "
            "prompt_key / answer_key."
        )
    for column in (key, answer_key):
        value = row[column]
        if isinstance(value, bool) or not isinstance(value, str | int | float | type(None)):
            raise ConfigError(
                f"{what} record {i} of {where} has {column!r} = {value!r}, a {type(value).__name__}; it must be text "
                "(a list or an object would train on its Python spelling): write the text itself."
            )
        if value is None or (isinstance(value, str) and not value.strip()):
            empty = "a null" if value is None else "an empty"
            raise ConfigError(
                f"{what} record {i} of {where} has {empty} {column!r}; fill it in or drop the record (a null would "
                "train on the text 'None', an empty one on nothing)."
            )
    out = dict(row)
    out["prompt"], out["answer"] = str(row[key]), str(row[answer_key])
    return out


# The first bytes of binary files a user may hand over as records by mistake, and what they are.
_BINARY_FILES = {
    b"PK\x03\x04": "a ZIP archive (a spreadsheet such as .xlsx or .ods, a .docx, or a .zip)",
    b"\xd0\xcf\x11\xe0": "an old Office file (.xls or .doc)",
    b"%PDF": "a PDF",
    b"PAR1": "a Parquet file without the .parquet name",
    b"\x89PNG": "a PNG image",
    b"\x1f\x8b": "a gzip archive",
}


def read_utf8(path: str | Path) -> str:
    """The text of a file the user wrote; not UTF-8 is one ``ValueError`` naming the line and byte, and the fix
    (a known binary format, e.g. a spreadsheet, is named as such)."""
    raw = Path(path).read_bytes()
    for magic, what in _BINARY_FILES.items():
        if raw.startswith(magic):
            raise ConfigError(
                f'{path} is {what}, not text; save the records as JSON Lines (one {{"prompt": …, "answer": …}} '
                "object a line), JSON, CSV or .parquet."
            )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); re-save the file "
            "as UTF-8."
        ) from None


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _object_once(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all different (JSON itself keeps the last of two silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _read_path(path: Path, split: str | None) -> list[dict]:
    if path.is_dir():
        return _read_directory(path, split)
    suffix = path.suffix.lower()
    if suffix in _LOADERS:
        from datasets import load_dataset

        try:
            return load_dataset(_LOADERS[suffix], data_files=str(path), split="train").to_list()
        except Exception as err:  # noqa: BLE001 - pyarrow/pandas raise many kinds for a file that does not parse
            kind = _LOADERS[suffix]
            raise ConfigError(f"{str(path)!r} does not read as {kind} ({type(err).__name__}: {err}).") from None
    text = read_utf8(path)
    if suffix == ".json" or text.lstrip().startswith("["):
        try:
            data = json.loads(text, object_pairs_hook=_object_once)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{err.lineno} is not valid JSON ({err.msg}).") from None
        except _DuplicateKey as err:
            raise ConfigError(f"{path}: a record gives key {err.key!r} twice; JSON would keep only the last value: "
                             "keep one.") from None  # fmt: skip
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise ConfigError(f"{str(path)!r} holds a JSON {type(data).__name__}; expected an array of records.")
        return data
    rows = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line, object_pairs_hook=_object_once))
            except json.JSONDecodeError as err:
                msg = f"{path}:{line_no} is not valid JSON ({err.msg}); expected one object a line."
                raise ConfigError(msg) from None
            except _DuplicateKey as err:
                raise ConfigError(f"{path}:{line_no}: key {err.key!r} is given twice in this record; JSON would keep "
                                 "only the last value: keep one.") from None  # fmt: skip
    return rows


def _read_directory(path: Path, split: str | None) -> list[dict]:
    from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

    if split is not None and (path / split).is_dir() and not (path / "dataset_dict.json").exists():
        path = path / split  # a folder of separately saved splits
    saved = (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()
    try:
        ds = load_from_disk(str(path)) if saved else load_dataset(str(path))
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds for a folder it cannot read
        raise ConfigError(
            f"{str(path)!r} is neither a datasets folder (save_to_disk) nor a directory datasets.load_dataset reads "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})."
        ) from None
    if isinstance(ds, DatasetDict):
        if split is None or split not in ds:
            if len(ds) == 1 and split is None:
                return next(iter(ds.values())).to_list()
            raise ConfigError(f"{str(path)!r} holds splits {sorted(ds)}; set the split name (got {split!r}).")
        ds = ds[split]
    assert isinstance(ds, Dataset)
    return ds.to_list()
