"""Manual narrative labels (LENS Appendix A, Table 5) read from an annotation file.

The file is the CSV written by ``lightning-unlearn lens export`` (columns ``id`` and ``label``, other columns are
kept for the annotator) or a JSONL file with ``id`` and ``label`` per line. Labels are Target-Dominant,
Target-Included, Target-Rejected or Invalid; only Target-Dominant rows enter the strict forget set.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lightning_unlearn.errors import ConfigError, MissingPathError

TARGET_DOMINANT = "Target-Dominant"
TARGET_INCLUDED = "Target-Included"
TARGET_REJECTED = "Target-Rejected"
MANUAL_INVALID = "Invalid"
MANUAL_LABELS = (TARGET_DOMINANT, TARGET_INCLUDED, TARGET_REJECTED, MANUAL_INVALID)
_ALIASES = {
    "targetdominant": TARGET_DOMINANT,
    "dominant": TARGET_DOMINANT,
    "targetincluded": TARGET_INCLUDED,
    "included": TARGET_INCLUDED,
    "targetrejected": TARGET_REJECTED,
    "rejected": TARGET_REJECTED,
    "invalid": MANUAL_INVALID,
}


def normalize_manual_label(value: str) -> str | None:
    """The canonical manual label for ``value`` (case, spaces, ``-`` and ``_`` ignored), or ``None``."""
    return _ALIASES.get(re.sub(r"[\s_\-]", "", str(value)).lower())


@dataclass(frozen=True)
class ManualLabels:
    """Manual labels keyed by response id, in file order.

    Args:
        ids: response ids (the ``id`` column written by the export).
        labels: one canonical manual label per id.
    """

    ids: tuple[str, ...]
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.labels):
            raise ConfigError(f"{len(self.ids)} ids but {len(self.labels)} labels.")
        bad = [lbl for lbl in self.labels if lbl not in MANUAL_LABELS]
        if bad:
            raise ConfigError(f"unknown manual labels {sorted(set(bad))}; use one of {', '.join(MANUAL_LABELS)}.")
        dupes = [k for k, n in Counter(self.ids).items() if n > 1]
        if dupes:
            raise ConfigError(f"duplicate ids in the manual labels: {dupes[:5]}.")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def by_id(self) -> dict[str, str]:
        """``{response id: manual label}``."""
        return dict(zip(self.ids, self.labels))

    def counts(self) -> dict[str, int]:
        """How many responses carry each manual label, every label of :data:`MANUAL_LABELS` listed (0 if none)."""
        c = Counter(self.labels)
        return {lbl: c.get(lbl, 0) for lbl in MANUAL_LABELS}

    @classmethod
    def read(cls, path: str | Path) -> ManualLabels:
        """Read a CSV (``id``, ``label`` columns) or JSONL annotation file.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: a missing column, an empty or unknown label (the message names the rows).
        """
        p = Path(path)
        if not p.is_file():
            raise MissingPathError(f"manual labels file {str(p)!r} does not exist.")
        if p.suffix == ".jsonl":
            with open(p, encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
        else:
            with open(p, encoding="utf-8", newline="") as f:
                rows = list(csv.DictReader(f))
        if not rows:
            raise ConfigError(f"manual labels file {str(p)!r} has no rows.")
        if "id" not in rows[0] or "label" not in rows[0]:
            raise ConfigError(f"manual labels file {str(p)!r} needs `id` and `label` columns; found {list(rows[0])}.")
        ids, labels, bad = [], [], []
        for n, row in enumerate(rows, start=2 if p.suffix != ".jsonl" else 1):
            canon = normalize_manual_label(row.get("label") or "")
            if canon is None:
                bad.append(f"line {n} ({row.get('label')!r})")
            ids.append(str(row["id"]))
            labels.append(canon)
        if bad:
            shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
            raise ConfigError(
                f"{str(p)!r}: missing or unknown labels at {shown}; every row needs one of {', '.join(MANUAL_LABELS)}."
            )
        return cls(tuple(ids), tuple(labels))
