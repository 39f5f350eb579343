"""The neutral (non-PII) corpus of continual pretraining, available offline.

Default: paragraphs of the docstrings of the installed Python's standard library (a fixed list of modules walked
in sorted order with ``inspect``, so the text is deterministic for a Python version). Alternatives: a text file,
a directory of ``*.txt`` files (one paragraph per blank-line-separated block), or a ``datasets`` directory
(``save_to_disk``) with a ``text`` column.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from pathlib import Path

from lightning_unlearn.errors import ConfigError, MissingPathError

# Modules without import side effects (no `this`, `antigravity`, GUI toolkits); walked in this order.
STDLIB_MODULES = (
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "bz2", "calendar", "cmath", "codecs",
    "collections", "colorsys", "concurrent.futures", "configparser", "contextlib", "copy", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "dis", "doctest", "email", "enum", "filecmp", "fnmatch", "fractions",
    "functools", "getopt", "gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html",
    "html.parser", "http.client", "http.server", "imaplib", "inspect", "io", "ipaddress", "itertools", "json",
    "keyword", "linecache", "locale", "logging", "lzma", "mailbox", "math", "mimetypes", "numbers", "operator",
    "optparse", "os", "pathlib", "pdb", "pickle", "pkgutil", "platform", "poplib", "pprint", "queue", "random",
    "re", "reprlib", "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket",
    "sqlite3", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "timeit", "tokenize", "trace", "traceback", "types", "typing", "unittest", "urllib.parse", "urllib.request",
    "uuid", "warnings", "wave", "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "zipfile", "zoneinfo",
)  # fmt: skip

_WS = re.compile(r"[ \t]+")


def _paragraphs(text: str, min_chars: int) -> list[str]:
    out = []
    for block in re.split(r"\n\s*\n", text):
        para = _WS.sub(" ", " ".join(line.strip() for line in block.splitlines())).strip()
        if len(para) >= min_chars and not para.startswith((">>>", "...")):
            out.append(para)
    return out


def stdlib_docstring_corpus(min_chars: int = 80, max_paragraphs: int | None = None) -> list[str]:
    """Deduplicated docstring paragraphs of :data:`STDLIB_MODULES`, in a deterministic order."""
    seen: set[str] = set()
    out: list[str] = []
    for mod_name in STDLIB_MODULES:
        try:
            module = importlib.import_module(mod_name)
        except ImportError:  # optional modules (e.g. sqlite3 built without its library)
            continue
        docs = [inspect.getdoc(module) or ""]
        for _, obj in sorted(inspect.getmembers(module), key=lambda kv: kv[0]):
            if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
                if getattr(obj, "__module__", None) == module.__name__:
                    docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            for para in _paragraphs(doc, min_chars):
                if para not in seen:
                    seen.add(para)
                    out.append(para)
                    if max_paragraphs is not None and len(out) >= max_paragraphs:
                        return out
    return out


def _is_datasets_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").exists() or (path / "state.json").exists())


def load_neutral_corpus(
    source: str | os.PathLike | None = None, min_chars: int = 80, max_paragraphs: int | None = None
) -> list[str]:
    """Neutral paragraphs from ``source``: ``None`` (stdlib docstrings), a ``.txt`` file, a directory of
    ``*.txt`` files, or a ``datasets`` directory with a ``text`` column.
    """
    if source is None:
        texts = stdlib_docstring_corpus(min_chars, max_paragraphs)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise MissingPathError(
                f"neutral corpus path {str(path)!r} does not exist. Give a .txt file, a directory of .txt files, "
                "a datasets directory with a 'text' column, or leave it unset for the built-in stdlib-docstring "
                "corpus."
            )
        if _is_datasets_dir(path):
            from datasets import load_from_disk

            ds = load_from_disk(str(path))
            if "text" not in ds.column_names:
                raise ConfigError(f"neutral datasets directory {str(path)!r} has no 'text' column ({ds.column_names}).")
            texts = [t for t in ds["text"] if t and len(t) >= min_chars]
        else:
            files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
            texts = []
            for f in files:
                texts.extend(_paragraphs(f.read_text(encoding="utf-8", errors="replace"), min_chars))
        if max_paragraphs is not None:
            texts = texts[:max_paragraphs]
    if not texts:
        raise ConfigError(
            f"neutral corpus {str(source) if source else 'stdlib docstrings'!r} has no paragraph of at least "
            f"{min_chars} characters."
        )
    return texts
