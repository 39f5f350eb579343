"""Memorization at every checkpoint (Lacuna): teacher-forced Prob/EM/ES per split and greedy extraction rate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.qa_records import encode_batch, forward_logits
from lightning_unlearn.callbacks.rank_split import generate_all, map_batches
from lightning_unlearn.data.records import read_records
from lightning_unlearn.generation import model_prompt
from lightning_unlearn.metrics.memorization import extracted, memorization_scores


class MemorizationEvaluation(CheckpointEvaluator):
    """Prob, EM, ES (means over records) and the extraction rate for each named split.

    Args:
        splits: split name (e.g. ``forget``, ``retain``, ``paraphrase``) → ``{prompt, answer}`` records or a file /
            datasets folder of them (:func:`~lightning_unlearn.data.records.read_records`); a record's optional
            ``target`` is the PII string sought in the greedy answer (default: answer).
        extraction: also generate greedily and report the extraction rate.
        max_new_tokens: token cap of the extraction generation.
        max_length: tokens per teacher-forced sequence.
        include_eos: score each answer's final token (the EOS) in EM and ES. Default False, as OpenUnlearning and
            Lacuna do (:func:`~lightning_unlearn.metrics.memorization.memorization_scores`); Prob keeps it always.
        name: see :class:`CheckpointEvaluator`.
        output_dir: see :class:`CheckpointEvaluator`.
        batch_size: sequences per forward / prompts per ``generate`` on each rank.
        prompt_key: column of the prompt (default ``prompt``; ``question`` is read when it is absent).
        answer_key: column of the answer.
        chat_template: render prompts with the tokenizer's chat template, as ``ForgetRetainDataModule`` does.
    """

    family = "memorization"

    def __init__(
        self,
        splits: Mapping[str, Sequence[dict] | str],
        extraction: bool = True,
        max_new_tokens: int = 32,
        max_length: int = 256,
        include_eos: bool = False,
        name: str | None = None,
        output_dir: str | None = None,
        batch_size: int = 8,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        chat_template: bool = False,
    ) -> None:
        super().__init__(name=name, output_dir=output_dir, batch_size=batch_size)
        if not splits:
            raise ValueError("MemorizationEvaluation needs at least one split, e.g. {'forget': records}.")
        keys = {"prompt_key": prompt_key, "answer_key": answer_key}
        self.splits = {name: read_records(recs, what=f"{name!r} split", **keys) for name, recs in splits.items()}
        self.chat_template = chat_template
        self.extraction = extraction
        self.max_new_tokens = max_new_tokens
        self.max_length = max_length
        self.include_eos = include_eos

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        out = {}
        for split, records in self.splits.items():

            def run(batch_records: list[dict]) -> list[tuple[float, float, float]]:
                batch = encode_batch(pl_module.tokenizer, batch_records, self.max_length, self.chat_template)
                m = memorization_scores(forward_logits(pl_module.model, batch), batch["labels"], self.include_eos)
                return list(zip(m["prob"].tolist(), m["em"].tolist(), m["es"].tolist()))

            scores = map_batches(records, self.batch_size, run, pl_module.model, self.progress)
            n = len(scores)
            out[split] = {
                "prob": sum(s[0] for s in scores) / n,
                "em": sum(s[1] for s in scores) / n,
                "es": sum(s[2] for s in scores) / n,
                "num_records": n,
            }
            if self.extraction:
                gens = generate_all(
                    pl_module.model,
                    pl_module.tokenizer,
                    [model_prompt(pl_module.tokenizer, r["prompt"], self.chat_template) for r in records],
                    self.batch_size,
                    self.max_new_tokens,
                    self.progress,
                )
                hits = extracted([g.text for g in gens], [str(r.get("target", r["answer"])) for r in records])
                out[split]["extraction_rate"] = sum(hits) / n
        return out
