"""Memorization at every checkpoint (Lacuna): teacher-forced Prob/EM/ES per split and greedy extraction rate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.qa_records import encode_batch, forward_logits
from lightning_unlearn.callbacks.rank_split import generate_all, map_batches
from lightning_unlearn.data.records import read_records
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.generation import model_prompt
from lightning_unlearn.metrics.memorization import AnswerMemorization, ExtractionRate


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

    Raises:
        ValueError: no split, or a split that is empty or lacks the prompt / answer column.
        FileNotFoundError: a split's file does not exist.

    Example::

        >>> from lightning_unlearn.callbacks import MemorizationEvaluation
        >>> evaluation = MemorizationEvaluation({"forget": [{"prompt": "Who?", "answer": "Alice."}]})
        >>> evaluation.splits  # each split read into {prompt, answer} records
        {'forget': [{'prompt': 'Who?', 'answer': 'Alice.'}]}
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
            raise ConfigError("MemorizationEvaluation needs at least one split, e.g. {'forget': records}.")
        keys = {"prompt_key": prompt_key, "answer_key": answer_key}
        self.splits = {name: read_records(recs, what=f"{name!r} split", **keys) for name, recs in splits.items()}
        self.chat_template = chat_template
        self.extraction = extraction
        self.max_new_tokens = max_new_tokens
        self.max_length = max_length
        self.include_eos = include_eos

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: each split's teacher-forced Prob, EM and ES, and its greedy extraction rate.

        Args:
            trainer: the trainer.
            pl_module: the module whose ``model`` and ``tokenizer`` are evaluated.
            step: the checkpoint's step.

        Returns:
            ``{split: {"prob", "em", "es", "num_records", "extraction_rate"}}`` (the rate only with ``extraction``).
        """
        out = {}
        for split, records in self.splits.items():
            scores = AnswerMemorization(include_eos=self.include_eos).to(pl_module.device)

            def forward(batch_records: list[dict]) -> tuple[dict, object]:
                batch = encode_batch(pl_module.tokenizer, batch_records, self.max_length, self.chat_template)
                return batch, forward_logits(pl_module.model, batch)

            def run(batch_records: list[dict], scores: AnswerMemorization = scores) -> list[None]:
                batch, logits = forward(batch_records)
                scores.update(logits, batch["labels"])
                return []

            map_batches(records, self.batch_size, run, pl_module.model, self.progress, dummy=forward)
            out[split] = scores.summary()
            if self.extraction:
                gens = generate_all(
                    pl_module.model,
                    pl_module.tokenizer,
                    [model_prompt(pl_module.tokenizer, r["prompt"], self.chat_template) for r in records],
                    self.batch_size,
                    self.max_new_tokens,
                    self.progress,
                )
                # every rank holds every answer (gathered), so the counts are not summed over ranks again
                rate = ExtractionRate(sync_on_compute=False)
                rate.update([g.text for g in gens], [str(r.get("target", r["answer"])) for r in records])
                out[split]["extraction_rate"] = float(rate.compute())
        return out
