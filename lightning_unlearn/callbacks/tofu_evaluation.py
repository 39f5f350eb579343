"""TOFU's metrics at every checkpoint: Prob, truth ratio and ROUGE-L recall per split, and forget quality."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.qa_records import encode_batch, forward_logits
from lightning_unlearn.callbacks.rank_split import generate_all, map_batches
from lightning_unlearn.data.records import TRUTH_RATIO_COLUMNS, read_records
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.generation import model_prompt
from lightning_unlearn.metrics.tofu import (
    forget_quality,
    mean_answer_nll,
    model_utility,
    rouge_l_recall,
    truth_ratio_score,
    truth_ratios,
)
from lightning_unlearn.models import eval_mode, load_causal_lm, require_model_dir


class TOFUEvaluation(CheckpointEvaluator):
    """TOFU's numbers, as OpenUnlearning computes them (:mod:`lightning_unlearn.metrics.tofu`), for named splits.

    Per split: ``prob`` (mean of exp(−mean answer-token NLL)), ``truth_ratio`` (the forget split with OU's
    ``closer_to_1_better`` aggregation, every other split with ``true_better``) and ``rougeL_recall`` of the greedy
    answer; ``forget_quality``, the KS p-value of the forget split's truth ratios against those of
    ``reference_model`` (computed once and kept in the callback state); and ``model_utility``, the harmonic mean of
    the other splits' Prob, ROUGE-L recall and truth ratio (TOFU's; the row lists them in ``model_utility_of``; TOFU's
    real-authors and world-facts splits normalise Prob over the options, which is not done here).

    Args:
        splits: split name → records or a file of them, each with ``paraphrased_answer`` (string) and
            ``perturbed_answer`` (list of strings) as TOFU's ``*_perturbed`` files have them.
        forget_split: the split that is forgotten (truth ratio ``closer_to_1_better``, forget quality).
        reference_model: local path of a model never trained on the forget split (a testbed's ``reference/``, a
            TOFU retain model); it must share the evaluated model's tokenizer.
        forget_quality: report forget quality; it needs ``reference_model``.
        rouge: generate greedily and report ROUGE-L recall.
        perturbed_mean: ``geometric`` (OU) or ``arithmetic`` (the TOFU paper) mean over perturbed answers.
        unicode_words: ROUGE tokenizer for any script instead of ``rouge-score``'s ``[a-z0-9]`` one.
        max_new_tokens: token cap of the greedy answers.
        max_length: tokens per teacher-forced sequence.
        name: see :class:`CheckpointEvaluator`.
        output_dir: see :class:`CheckpointEvaluator`.
        batch_size: sequences per forward / prompts per ``generate`` on each rank.
        prompt_key: column of the prompt (default ``prompt``; ``question`` is read when it is absent).
        answer_key: column of the answer.
        chat_template: render prompts with the tokenizer's chat template.

    Raises:
        ValueError: ``forget_split`` not among the splits, ``forget_quality`` without ``reference_model``, an
            unknown ``perturbed_mean``, or a record without the paraphrased / perturbed answers.
        FileNotFoundError: ``reference_model`` or a split's file does not exist.

    Example::

        >>> from lightning_unlearn.callbacks import TOFUEvaluation
        >>> record = {"prompt": "Who wrote it?", "answer": "Alice.", "paraphrased_answer": "It was Alice.",
        ...           "perturbed_answer": ["Bob.", "Carol."]}
        >>> tofu = TOFUEvaluation({"forget": [record], "retain": [record]}, forget_quality=False)
        >>> sorted(tofu.splits), tofu.forget_split  # retain's Prob, ROUGE-L and truth ratio make model utility
        (['forget', 'retain'], 'forget')
    """

    family = "tofu"

    def __init__(
        self,
        splits: Mapping[str, Sequence[dict] | str],
        forget_split: str = "forget",
        reference_model: str | None = None,
        forget_quality: bool = True,
        rouge: bool = True,
        perturbed_mean: Literal["geometric", "arithmetic"] = "geometric",
        unicode_words: bool = False,
        max_new_tokens: int = 32,
        max_length: int = 256,
        name: str | None = None,
        output_dir: str | None = None,
        batch_size: int = 8,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        chat_template: bool = False,
    ) -> None:
        super().__init__(name=name, output_dir=output_dir, batch_size=batch_size)
        if forget_split not in splits:
            raise ConfigError(f"forget_split={forget_split!r} is not among the splits {sorted(splits)}; name it.")
        if forget_quality and reference_model is None:
            raise ConfigError(
                "TOFUEvaluation: forget quality needs a model never trained on the forget set; set reference_model "
                "to its local path (a testbed's reference/ or a TOFU retain model), or forget_quality: false."
            )
        if reference_model is not None:
            require_model_dir(reference_model, "reference_model")
        if perturbed_mean not in ("geometric", "arithmetic"):
            raise ConfigError(f"perturbed_mean={perturbed_mean!r}; use 'geometric' (OU) or 'arithmetic' (TOFU paper).")
        keys = {"prompt_key": prompt_key, "answer_key": answer_key, "require": TRUTH_RATIO_COLUMNS}
        self.splits = {s: read_records(recs, what=f"{s!r} split", **keys) for s, recs in splits.items()}
        self.forget_split = forget_split
        self.reference_model = reference_model
        self.forget_quality = forget_quality
        self.rouge = rouge
        self.perturbed_mean = perturbed_mean
        self.unicode_words = unicode_words
        self.max_new_tokens = max_new_tokens
        self.max_length = max_length
        self.chat_template = chat_template

    def _split_nll(self, model: nn.Module, tokenizer, records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Collective: mean answer NLL of each record's answer ``(N,)``, paraphrase ``(N,)``, perturbed ``(N, K)``."""
        k = len(records[0]["perturbed_answer"])
        if any(len(r["perturbed_answer"]) != k for r in records):
            raise ConfigError("every record of a split needs the same number of perturbed answers (TOFU has 5).")
        # One teacher-forced sequence per (record, answer): the answer, the paraphrase, then the K perturbed ones.
        seqs = [
            {"prompt": r["prompt"], "answer": a}
            for r in records
            for a in (r["answer"], r["paraphrased_answer"], *r["perturbed_answer"])
        ]

        def run(batch_records: list[dict]) -> list[float]:
            batch = encode_batch(tokenizer, batch_records, self.max_length, self.chat_template)
            return mean_answer_nll(forward_logits(model, batch), batch["labels"]).tolist()

        nll = np.asarray(map_batches(seqs, self.batch_size, run, model, self.progress)).reshape(len(records), k + 2)
        return nll[:, 0], nll[:, 1], nll[:, 2:]

    def _ratios(self, model: nn.Module, tokenizer, records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        answer, para, pert = self._split_nll(model, tokenizer, records)
        return np.exp(-answer), truth_ratios(para, pert, self.perturbed_mean)

    @override
    def compute_base(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        """Collective: the reference model's truth ratios on the forget split (for forget quality), once.

        Args:
            trainer: the trainer.
            pl_module: the module evaluated (its device and tokenizer are used for the reference).

        Returns:
            ``{"reference_forget_truth_ratios": [...]}``, or ``{}`` without ``forget_quality``.
        """
        if not self.forget_quality:
            return {}
        reference = load_causal_lm(self.reference_model).to(pl_module.device)
        with eval_mode(reference):
            _, ratios = self._ratios(reference, pl_module.tokenizer, self.splits[self.forget_split])
        return {"reference_forget_truth_ratios": ratios.tolist()}

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: Prob, truth ratio and ROUGE-L recall per split, forget quality and model utility.

        Args:
            trainer: the trainer.
            pl_module: the module whose ``model`` is evaluated.
            step: the checkpoint's step.

        Returns:
            ``{split: {"prob", "truth_ratio", "num_records", "rougeL_recall"}, "forget_quality",
            "model_utility", "model_utility_of"}`` (each part where it applies).

        Raises:
            ValueError: a split's records have different numbers of perturbed answers (from ``_split_nll``).
        """
        out: dict = {}
        for split, records in self.splits.items():
            prob, ratios = self._ratios(pl_module.model, pl_module.tokenizer, records)
            aggregator = "closer_to_1_better" if split == self.forget_split else "true_better"
            out[split] = {
                "prob": float(prob.mean()),
                "truth_ratio": truth_ratio_score(ratios, aggregator),
                "num_records": len(records),
            }
            if self.rouge:
                prompts = [model_prompt(pl_module.tokenizer, r["prompt"], self.chat_template) for r in records]
                gens = generate_all(
                    pl_module.model, pl_module.tokenizer, prompts, self.batch_size, self.max_new_tokens, self.progress
                )
                recalls = rouge_l_recall(
                    [g.text for g in gens], [r["answer"] for r in records], unicode_words=self.unicode_words
                )
                out[split]["rougeL_recall"] = float(np.mean(recalls))
            if split == self.forget_split and self.forget_quality:
                out["forget_quality"] = forget_quality(ratios, self.base["reference_forget_truth_ratios"])
        # TOFU's model utility: the harmonic mean of every non-forget split's Prob, ROUGE-L and truth ratio.
        declared = {
            f"{split}/{key}": out[split][key]
            for split in self.splits
            if split != self.forget_split
            for key in ("prob", "rougeL_recall", "truth_ratio")
            if key in out[split]
        }
        if declared:
            out["model_utility"] = model_utility(declared)
            out["model_utility_of"] = sorted(declared)
        return out
