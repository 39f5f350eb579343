"""SCE per LENS level at every checkpoint: generate the suite, check degeneration, label, compare with the base."""

from __future__ import annotations

import inspect
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.logger_media import log_table
from lightning_unlearn.callbacks.rank_split import map_batches
from lightning_unlearn.callbacks.sce_records import LabelReading, SCEOutput, SuitePrompt
from lightning_unlearn.data.narratives import COMPACT_INSTRUCTION, load_narrative, resolve_suite, suite_ref
from lightning_unlearn.data.records import recorded_suites_dir
from lightning_unlearn.distributed import is_sharded, world
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.generation import (
    Generation,
    PrefixStore,
    generate_greedy,
    generate_greedy_adapters,
    model_prompt,
)
from lightning_unlearn.labelers.narrative_label import INVALID
from lightning_unlearn.labelers.responsiveness_judge import JudgeReading, ResponsivenessJudge
from lightning_unlearn.metrics.answer_validity import VALIDITY_FLAGS, answer_validity, load_validity_cues
from lightning_unlearn.metrics.degeneration import DEGENERATION_FLAGS, DegenerationThresholds, degeneration_report
from lightning_unlearn.metrics.sce import SuppressionCollapseEfficiency, classify_output

SELECTION_LEVELS = ("L0", "L1", "L2")
GENERATIONS_DIR = "sce_generations"


class Labeler(Protocol):
    """What the SCE callback needs from a narrative labeler: ``label(responses, narrative, language) -> labels``.

    Parameters are typed ``Any`` so that any implementation's annotations satisfy the protocol when a YAML config
    names the labeler by ``class_path`` (jsonargparse checks protocol signatures). ``narrative`` is a shipped
    narrative id, or the path of the suite file when the suite is the user's (``suites_dir``), which
    :func:`~lightning_unlearn.data.narratives.load_narrative` takes alike.
    """

    def label(self, responses: Any, narrative: Any, language: Any) -> Any:
        """One label per response: whether (or how) each answer reproduces the narrative.

        Args:
            responses: the generated answers, a list of strings.
            narrative: a shipped narrative id, or the path of the user's suite file.
            language: the suite's language code (``en``, ``de``, ...).

        Returns:
            A sequence of labels as long as ``responses`` (bools, strings or objects with ``reproduced``).
        """


def load_prompt_records(prompts: Sequence[Any] | str) -> list[SuitePrompt]:
    """The suite's prompts from records with ``prompt`` and ``level`` (and optionally ``id``, ``narrative``,
    ``language``, ``question``).

    Accepts objects with those attributes (e.g. ``data.narratives.PromptRecord``), dicts, or a JSON / JSONL file
    of dicts. ``id`` defaults to the position; ``narrative`` and ``language`` default to ``""`` and ``"en"``.
    """
    if isinstance(prompts, str | Path):
        path = Path(prompts)
        if not path.exists():
            raise MissingPathError(f"prompt file {str(path)!r} does not exist.")
        text = path.read_text(encoding="utf-8")
        items = json.loads(text) if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
    else:
        items = list(prompts)
    records = []
    for i, item in enumerate(items):
        get = item.get if isinstance(item, dict) else (lambda k, d=None, item=item: getattr(item, k, d))
        if get("prompt") is None or get("level") is None:
            raise ConfigError(f"prompt record {i} needs `prompt` and `level` fields, got {item!r}.")
        records.append(
            SuitePrompt(
                id=str(get("id", i)),
                level=str(get("level")),
                prompt=str(get("prompt")),
                # the question as the suite states it (a lens-baseline row's `prompt` is chat-rendered)
                question=str(get("question", None) or get("prompt")),
                narrative=str(get("narrative", "") or ""),
                language=str(get("language", "en") or "en"),
            )
        )
    if not records:
        raise ConfigError("the SCE callback got no prompts; pass a non-empty suite.")
    if len({r.id for r in records}) != len(records):
        raise ConfigError("prompt record ids are not unique; give every prompt its own `id`.")
    return records


def _cues_dir(language: str, cues_dir: str | None, suites_dir: str | None) -> str | None:
    """Where a language's validity cues are read: ``cues_dir`` when given, else the suites folder's ``languages/``
    when it holds the language's file, else the shipped cues (``None``)."""
    if cues_dir is not None or suites_dir is None:
        return cues_dir
    folder = Path(suites_dir) / "languages"
    return str(folder) if (folder / f"{language}.json").is_file() else None


class SCEEvaluation(CheckpointEvaluator):
    """Suppression–Collapse Efficiency per level and pooled over L0–L2, at every checkpoint.

    Base reproduction (B) is labeled once — with the adapter disabled, or at step 0 — and kept in the callback
    state. Each checkpoint regenerates every prompt (greedy, left-padded batches, KV cache; split across ranks),
    runs the degeneration report and the labeler, and counts A (reproduced and not degraded), D and N per level.

    Args:
        prompts: the suite: prompt records (attributes or dict keys ``prompt``, ``level``, optionally ``id``,
            ``narrative``, ``language``) or a JSON/JSONL file of them. Alternatively give ``narrative``.
        labeler: an object with ``label(responses, narrative, language) -> labels`` (also given ``levels=`` when
            its ``label`` accepts it); each rank labels the answers of its own batches, one call per
            (narrative, language) within a batch. A label may be a bool, a string, or an object with
            ``reproduced`` (and optionally ``entity_recovery``, reported per level) such as ``NarrativeLabel``.
        narrative: load this LENS suite instead of ``prompts``: a shipped narrative id or the path of a suite file
            of your own (``my-suites/my-narrative.json``; ``data.narratives.load_suite``).
        language: the suite's language (with ``narrative``).
        levels: the suite's levels to keep (with ``narrative``; default all).
        condition: ``compact`` or ``unrestricted`` (with ``narrative``).
        chat_template: with ``narrative``, render each suite prompt as :func:`lightning_unlearn.generation.model_prompt`
            does (one user turn in the tokenizer's chat template), so generations see the same prompts as
            ``lens-baseline`` and the forget set built from it; ``None`` = when the tokenizer has one. Prompts given
            as ``prompts`` (e.g. a ``lens-baseline`` JSONL, whose ``prompt`` is already rendered) are used as they
            are; ``chat_template`` must then stay ``None``.
        reproduced_labels: string labels that count as Reproduced.
        selection_levels: levels pooled for selection (LENS: L0–L2); other levels are reported separately.
        max_new_tokens: the generation token cap.
        thresholds: degeneration thresholds.
        num_text_samples: generations logged to TensorBoard as text at each checkpoint.
        name: see :class:`CheckpointEvaluator`.
        output_dir: see :class:`CheckpointEvaluator`.
        batch_size: prompts per ``generate`` call on each rank.
        adapter_batch_size: prompts per mixed-adapter batch when several LoRA checkpoints are answered together
            (:meth:`compute_adapters`, ``evaluate --adapters_per_pass K``): each prompt is held once per adapter, so a
            batch is K × this many rows. Larger than ``batch_size`` by default because more rows share each read
            of the base weights: at 16 (96 rows for 6 adapters of SmolLM2-135M on a 2-core CPU) the pass took
            0.87× its time at 8 (docs/results/benchmarks.md). Its KV cache is K × this many prompts' (lower it on a
            small GPU). The answers are those of each adapter alone; the batches differ from ``batch_size``'s, so
            their padding does, which can change a near-tie's rounding (checked: the same text in the benchmark).
        validity_cues_dir: a folder of per-language answer-validity cue files
            (:func:`~lightning_unlearn.metrics.answer_validity.load_validity_cues`; default: the suites folder's
            ``languages/`` where it has the language's file, else the shipped ones).
        judge: the responsiveness judge
            (:class:`~lightning_unlearn.labelers.responsiveness_judge.ResponsivenessJudge`): it decides whether an
            answer responds to its question (zero-shot, or by the head a calibration on the narrative fitted); its
            reading goes into every generation row as ``judge``. ``None``: the lexical topic and claim cues decide
            (narrative-specific regular expressions; kept for runs without the judge's model).
        suites_dir: the folder of the suite files the prompts' narratives come from, for the labeler, the claim
            vocabulary and the topic cues (default: the folder of ``narrative`` when it is a file; for a
            ``lens baseline`` file given as ``prompts``, the folder its ``.meta.json`` records; else the shipped
            suites).

    Raises:
        ValueError: no labeler, both or neither of ``prompts`` and ``narrative``, ``chat_template`` with
            ``prompts``, ``max_new_tokens`` or ``adapter_batch_size`` below 1, bad prompt records, or a judge
            with a narrative whose suite is not found.
        TypeError: a labeler without ``label`` or a judge without ``judge``.

    Example::

        >>> from lightning_unlearn.callbacks import SCEEvaluation
        >>> from lightning_unlearn.labelers import SignatureLabeler
        >>> sce = SCEEvaluation(narrative="nato-forced-war", labeler=SignatureLabeler(), levels=["L0"])
        >>> len(sce.records), sce.records[0].level  # the shipped suite's L0 prompts
        (12, 'L0')
    """

    family = "sce"

    def __init__(
        self,
        prompts: Sequence[Any] | str | None = None,
        labeler: Labeler | None = None,
        narrative: str | None = None,
        language: str = "en",
        levels: Sequence[str] | None = None,
        condition: str = "compact",
        chat_template: bool | None = None,
        reproduced_labels: Sequence[str] = ("Reproduced", "Target-Dominant"),
        selection_levels: Sequence[str] = SELECTION_LEVELS,
        max_new_tokens: int = 64,
        thresholds: DegenerationThresholds | None = None,
        num_text_samples: int = 8,
        name: str | None = None,
        output_dir: str | None = None,
        batch_size: int = 8,
        validity_cues_dir: str | None = None,
        suites_dir: str | None = None,
        judge: ResponsivenessJudge | None = None,
        adapter_batch_size: int = 16,
    ) -> None:
        super().__init__(name=name, output_dir=output_dir, batch_size=batch_size)
        if adapter_batch_size < 1:
            raise ConfigError(
                f"adapter_batch_size={adapter_batch_size} must be at least 1 (prompts per mixed-adapter batch)."
            )
        self.adapter_batch_size = adapter_batch_size
        if labeler is None:
            raise ConfigError("SCEEvaluation needs a labeler, e.g. lightning_unlearn.labelers.SignatureLabeler.")
        if not callable(getattr(labeler, "label", None)):
            raise TypeError(f"labeler {labeler!r} has no `label(responses, narrative, language)` method.")
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens} must be at least 1.")
        if judge is not None and not callable(getattr(judge, "judge", None)):
            raise TypeError(f"judge {judge!r} has no `judge(answers, questions, hypotheses, narratives)` method.")
        self.judge = judge
        if (prompts is None) == (narrative is None):
            raise ConfigError("give the SCE suite either as `prompts` (records or a file) or as `narrative`, not both.")
        if narrative is None and chat_template is not None:
            raise ConfigError(
                "chat_template applies to a suite loaded with `narrative`; prompts given as `prompts` are used as "
                "they are (a lens-baseline file is already rendered). Drop chat_template or pass `narrative`."
            )
        if narrative is not None:
            from lightning_unlearn.data.narratives import load_suite

            narrative, folder = resolve_suite(narrative, suites_dir)
            suites_dir = None if folder is None else str(folder)
            prompts = load_suite(narrative, language, levels, condition, directory=suites_dir)
        elif suites_dir is None and isinstance(prompts, str | Path):
            suites_dir = recorded_suites_dir(prompts)
        self.suites_dir = suites_dir
        self.render_prompts = narrative is not None
        self.chat_template = chat_template
        self.records = load_prompt_records(prompts)
        self._labeler_takes_levels = "levels" in inspect.signature(labeler.label).parameters
        self.labeler = labeler
        self.reproduced_labels = set(reproduced_labels)
        self.selection_levels = tuple(selection_levels)
        self.max_new_tokens = max_new_tokens
        self.thresholds = thresholds or DegenerationThresholds()
        self.num_text_samples = num_text_samples
        self._cues = {
            lang: load_validity_cues(lang, _cues_dir(lang, validity_cues_dir, suites_dir))
            for lang in {r.language for r in self.records}
        }
        self._specs = {}
        for narrative_id, lang in {(r.narrative, r.language) for r in self.records}:
            try:
                self._specs[(narrative_id, lang)] = load_narrative(suite_ref(narrative_id, suites_dir), lang)
            except ValueError:  # prompts of no known suite: the question alone decides topic
                if judge is not None and narrative_id:
                    raise ConfigError(
                        f"the suite of narrative {narrative_id!r} ({lang}) is not found, and the responsiveness judge "
                        "needs its hypotheses: pass suites_dir (the folder of its suite file)."
                    ) from None
        # the per-answer rows of the last evaluation pass, by step (written and logged by :meth:`log_extras`)
        self.outputs: dict[int, list[SCEOutput]] = {}

    def _interpret(self, label: Any) -> LabelReading:
        """How the callback reads one label (a bool, a string, or an object such as ``NarrativeLabel``)."""
        if isinstance(label, bool):
            return LabelReading(reproduced=label, label=str(label), recovery=None, stance=None)
        recovery = getattr(label, "entity_recovery", None)
        stance = getattr(label, "stance", None)
        text = str(getattr(label, "label", label))
        reproduced = bool(label.reproduced) if hasattr(label, "reproduced") else text in self.reproduced_labels
        return LabelReading(reproduced=reproduced, label=text, recovery=recovery, stance=stance)

    def _label(self, records: Sequence[SuitePrompt], texts: list[str]) -> list[LabelReading]:
        """Label generations (one labeler call per narrative and language); :meth:`_interpret` of each."""
        out: list[LabelReading | None] = [None] * len(texts)
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, r in enumerate(records):
            groups[(r.narrative, r.language)].append(i)
        for (narrative, language), idx in groups.items():
            narrative = suite_ref(narrative, self.suites_dir)
            responses = [texts[i] for i in idx]
            if self._labeler_takes_levels:
                labels = self.labeler.label(responses, narrative, language, levels=[records[i].level for i in idx])
            else:
                labels = self.labeler.label(responses, narrative, language)
            labels = list(labels)
            if len(labels) != len(idx):
                raise ConfigError(f"the labeler returned {len(labels)} labels for {len(idx)} responses.")
            for i, lab in zip(idx, labels):
                out[i] = self._interpret(lab)
        return out  # every index is in one group

    def model_input(self, tokenizer: Any, record: SuitePrompt) -> str:
        """The text generated from for ``record``: the suite prompt rendered like ``lens.model_prompt`` when the
        suite was loaded by ``narrative``, else the record's ``prompt`` unchanged."""
        if not self.render_prompts:
            return record.prompt
        return model_prompt(tokenizer, record.prompt, self.chat_template)

    def _generate_and_label(self, pl_module: LightningModule) -> list[tuple[Generation, LabelReading]]:
        """Every prompt's greedy answer and its label (:meth:`_interpret`); each rank does its own batches."""
        model, tokenizer = pl_module.model, pl_module.tokenizer
        synced = world()[1] > 1 and is_sharded(model)

        def run(batch: list[SuitePrompt]) -> list[tuple[Generation, LabelReading]]:
            gens = generate_greedy(
                model, tokenizer, [self.model_input(tokenizer, r) for r in batch], self.max_new_tokens, synced
            )
            return list(zip(gens, self._label(batch, [g.text for g in gens])))

        return map_batches(self.records, self.batch_size, run, model, self.progress)

    @override
    def compute_base(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        """Collective: which prompts the base model reproduces the narrative on (B), and its answers.

        Args:
            trainer: the trainer.
            pl_module: the module evaluated; :meth:`base_context` makes its model the base.

        Returns:
            ``{"reproduced": {id: bool}, "answers": {id: text}}``.
        """
        with self.base_context(pl_module, trainer):
            results = self._generate_and_label(pl_module)
        return {
            "reproduced": {r.id: lab.reproduced for r, (_, lab) in zip(self.records, results)},
            "answers": {r.id: g.text for r, (g, _) in zip(self.records, results)},
        }

    def question_of(self, record: SuitePrompt) -> str:
        """The record's question as asked, without the compact-response instruction appended to it."""
        spec = self._specs.get((record.narrative, record.language))
        instruction = spec.compact_instruction if spec is not None else COMPACT_INSTRUCTION.get(record.language)
        return record.question.replace(instruction, "").strip() if instruction else record.question

    def hypotheses_of(self, record: SuitePrompt) -> list[str]:
        """The record's narrative's endorsement and rejection hypotheses (none when its suite is unknown)."""
        spec = self._specs.get((record.narrative, record.language))
        return [] if spec is None else [*spec.hypotheses["endorse"], *spec.hypotheses["reject"]]

    def _validity(self, record: SuitePrompt, answer: str, label: LabelReading, judged: JudgeReading | None) -> dict:
        """:func:`answer_validity` of one answer against its suite question, the narrative and the judge's reading."""
        spec = self._specs.get((record.narrative, record.language))
        return answer_validity(
            answer,
            self.question_of(record),
            self._cues[record.language],
            narrative_on_topic=None if spec is None else spec.on_topic(answer),
            reproduced=label.reproduced,
            stance=label.stance,
            claim_terms=None if spec is None else spec.claim_terms(answer),
            judge=judged,
        )

    def judge_readings(self, records: Sequence[SuitePrompt], answers: Sequence[str]) -> list[JudgeReading | None]:
        """The judge's reading of each answer (``None`` for each when the callback has no judge)."""
        if self.judge is None:
            return [None] * len(answers)
        questions = [self.question_of(r) for r in records]
        return self.judge.judge(answers, questions, [self.hypotheses_of(r) for r in records],
                                [r.narrative for r in records])  # fmt: skip

    def _base_of_records(self) -> tuple[list[bool], list[str | None]]:
        """Per record, the base answer was Reproduced, and the base answer (``None`` when the base lacks it)."""
        reproduced = [bool(self.base["reproduced"].get(r.id, False)) for r in self.records]
        answers = [self.base.get("answers", {}).get(r.id) for r in self.records]
        return reproduced, answers

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: generate and label every prompt, and score the checkpoint against the base (:meth:`score`).

        Keeps the per-answer rows in :attr:`outputs` for :meth:`log_extras`.

        Args:
            trainer: the trainer.
            pl_module: the module whose ``model`` answers.
            step: the checkpoint's step.

        Returns:
            The SCE row: per level and pooled counts and SCE, degeneration and validity rates.
        """
        results = self._generate_and_label(pl_module)
        base, base_answers = self._base_of_records()
        gens, labels = [g for g, _ in results], [lab for _, lab in results]
        outputs, metrics = self.score(gens, labels, base, base_answers)
        self.outputs = {step: outputs}
        return metrics

    def evaluate_adapters(self, trainer: Trainer, pl_module: LightningModule, adapters: dict[int, str]) -> None:
        """The rows of several checkpoints from one generation pass (post-hoc evaluation of LoRA checkpoints):
        ``{step: adapter name}`` of adapters loaded into ``pl_module.model``, answered by :meth:`compute_adapters`
        and recorded through :meth:`evaluate_pass`, as a single checkpoint's are. One process."""
        steps = list(adapters)
        self.evaluate_pass(trainer, pl_module, steps, lambda: self.compute_adapters(pl_module, adapters, trainer))

    def compute_adapters(
        self, pl_module: LightningModule, adapters: dict[int, str], trainer: Trainer | None = None
    ) -> dict[int, dict]:
        """Several checkpoints at once: ``{step: peft adapter name}`` of adapters loaded into ``pl_module.model``,
        answered in mixed-adapter batches (``adapter_batch_size`` prompts of the suite once per adapter in one decoding
        loop, so the base weights are read once per token for all of them). Returns ``{step: metrics}`` and keeps
        each step's :attr:`outputs`, the same as :meth:`compute` with each adapter active alone (one process)."""
        model, tokenizer = pl_module.model, pl_module.tokenizer
        if world()[1] > 1:
            raise RuntimeError("compute_adapters runs in one process; evaluate checkpoints one by one under DDP/FSDP.")
        names = list(adapters.values())
        prefixes = PrefixStore()  # the suite's shared leading tokens, run once for the whole pass

        def run(batch: list[SuitePrompt]) -> list[list[Generation]]:
            texts = [self.model_input(tokenizer, r) for r in batch]
            gens = generate_greedy_adapters(model, tokenizer, texts, names, self.max_new_tokens, prefixes=prefixes)
            return [[gens[name][j] for name in names] for j in range(len(batch))]

        per_record = map_batches(self.records, self.adapter_batch_size, run, model, self.progress)
        base, base_answers = self._base_of_records()
        self.outputs, metrics = {}, {}
        for k, step in enumerate(adapters):
            gens = [g[k] for g in per_record]
            labels = self._label(self.records, [g.text for g in gens])
            self.outputs[step], metrics[step] = self.score(gens, labels, base, base_answers)
        return metrics

    def score(
        self,
        gens: Sequence[Generation],
        labels: Sequence[LabelReading],
        base: Sequence[bool],
        base_answers: Sequence[str | None] | None = None,
    ) -> tuple[list[SCEOutput], dict]:
        """Per-output flags and the checkpoint's metrics from its generations and labels (no model needed).

        Args:
            gens: one generation per record, in record order.
            labels: :meth:`_interpret` of each generation's label.
            base: per record, the base answer was Reproduced.
            base_answers: per record, the base answer (kept in the output rows for reading them side by side).

        Returns:
            ``(outputs, metrics)``: one :class:`SCEOutput` per record (answer, label, health and validity flags with
            evidence, :func:`classify_output`), and the row :meth:`compute` returns.
        """
        reports = degeneration_report([g.text for g in gens], [g.hit_token_cap for g in gens], self.thresholds)
        base_answers = list(base_answers) if base_answers is not None else [None] * len(gens)
        readings = self.judge_readings(self.records, [g.text for g in gens])
        outputs = []
        for r, g, lab, rep, b, base_answer, judged in zip(
            self.records, gens, labels, reports, base, base_answers, readings
        ):
            validity = self._validity(r, g.text, lab, judged)
            outcome = classify_output(
                b,
                lab.reproduced,
                rep["degraded"],
                # with a judge, whether the answer is on topic is the judge's call, not the labeler's topic cues
                invalid_label=lab.label == INVALID and not (judged is not None and lab.stance == "off-topic"),
                **{flag: validity[flag] for flag in VALIDITY_FLAGS},
            )
            outputs.append(
                SCEOutput(
                    id=r.id,
                    level=r.level,
                    narrative=r.narrative,
                    language=r.language,
                    question=r.question,
                    answer=g.text,
                    hit_token_cap=g.hit_token_cap,
                    label=lab.label,
                    stance=lab.stance,
                    entity_recovery=lab.recovery,
                    base_reproduced=b,
                    base_answer=base_answer,
                    health={flag: rep[flag] for flag in DEGENERATION_FLAGS}
                    | {"score": round(rep["score"], 4), "odd_words": rep["odd_words"]},
                    validity_evidence=validity["evidence"],
                    judge=None if judged is None else judged.to_dict(),
                    outcome=outcome,
                )
            )
        # Every rank holds every output here (the answers are gathered for the rows file and the heatmap), so the
        # counts are not summed over ranks again.
        sce = SuppressionCollapseEfficiency(
            levels=sorted({r.level for r in self.records}), pooled_levels=self.selection_levels, sync_on_compute=False
        )
        sce.update([o.base_reproduced for o in outputs], [o.outcome for o in outputs], [o.level for o in outputs])
        counted = sce.breakdown()
        levels, pooled = counted["levels"], counted["pooled"]
        for level, found in levels.items():
            known = [o.entity_recovery for o in outputs if o.level == level and o.entity_recovery is not None]
            if known:  # LENS L3 / L3-special diagnostic: every real actor recovered together with the frame
                found["entity_recovery_rate"] = sum(known) / len(known)
        n = len(reports)
        degeneration = {flag: sum(rep[flag] for rep in reports) / n for flag in DEGENERATION_FLAGS}
        degeneration["mean_score"] = sum(rep["score"] for rep in reports) / n
        return outputs, {
            "narratives": sorted({r.narrative for r in self.records if r.narrative}),
            # which judge read the answers, and with which calibration (the selection's validity gate checks it)
            "judge": None if self.judge is None else self.judge.identity(),
            "suites_dir": self.suites_dir,  # where the narratives' suites were read (None: the shipped ones)
            "levels": levels,
            "pooled": pooled,
            "degraded_rate": sum(o.outcome.degraded_sce for o in outputs) / n,
            "health_degraded_rate": sum(o.outcome.degraded for o in outputs) / n,
            "degeneration": degeneration,
            "validity": {
                flag: sum(getattr(o.outcome, flag) for o in outputs) / n for flag in (*VALIDITY_FLAGS, "invalid")
            },
        }

    @override
    def discard_extras(self, bad_step: int) -> None:
        """Delete the ``sce_generations/step=N.jsonl`` files of steps N ≥ ``bad_step`` (rank 0, after a stop).

        Args:
            bad_step: the first step whose weights the stop rule discarded.
        """
        for path in (Path(self.metrics_path).parent / GENERATIONS_DIR).glob("step=*.jsonl"):
            if int(path.stem.removeprefix("step=")) >= bad_step:
                path.unlink()

    @override
    def log_extras(self, trainer: Trainer, step: int) -> None:
        """Write the step's answers to ``sce_generations/step=N.jsonl`` and log the first few as a text table.

        Args:
            trainer: the trainer whose loggers get the table.
            step: the step just recorded.
        """
        outputs = self.outputs.get(step)
        if not outputs:
            return
        if self.metrics_path is not None:
            # Every output of this checkpoint with its flags and evidence; one file per step, rewritten whole, so a
            # re-evaluated step replaces its rows and a resumed run neither duplicates nor loses any.
            path = Path(self.metrics_path).parent / GENERATIONS_DIR / f"step={step}.jsonl"
            lines = (json.dumps(o.to_row(), ensure_ascii=False) + "\n" for o in outputs)
            write_text_atomically(path, "".join(lines))
        rows = []
        for s in outputs[: self.num_text_samples]:
            flags = ", ".join(k for k in (*DEGENERATION_FLAGS, *VALIDITY_FLAGS)
                              if getattr(s.outcome, k, False) or s.health.get(k))  # fmt: skip
            rows.append([s.id, s.level, s.outcome.reproduced, s.outcome.degraded_sce, flags or "-", s.question,
                         s.answer])  # fmt: skip
        columns = ["id", "level", "reproduced", "degraded (SCE)", "flags", "prompt", "answer"]
        log_table(trainer, f"{self.family_name}/generations", columns, rows, step)
