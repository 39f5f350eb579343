"""Membership inference at every checkpoint: each attack's AUC, members vs non-members, and MUSE's PrivLeak."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from lightning.pytorch import LightningModule, Trainer
from torch import nn
from typing_extensions import override

from lightning_unlearn.callbacks.checkpoint_evaluator import CheckpointEvaluator
from lightning_unlearn.callbacks.qa_records import encode_batch, forward_logits
from lightning_unlearn.callbacks.rank_split import map_batches
from lightning_unlearn.data.records import read_records
from lightning_unlearn.distributed import is_sharded
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.metrics.mia import (
    MembershipInferenceAUC,
    gradnorm_scores,
    loss_scores,
    min_k_plus_plus_scores,
    min_k_scores,
    privleak,
    zlib_scores,
)
from lightning_unlearn.models import eval_mode, load_causal_lm, require_model_dir

ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus", "gradnorm", "reference")
# PrivLeak compares the same attack on two models; GradNorm's norm runs over whatever requires grad (a LoRA adapter
# on one side, every weight on the other) and the reference attack is 0 on the reference itself: both are left out.
_PRIVLEAK_ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus")


class MIAEvaluation(CheckpointEvaluator):
    """AUC of each membership-inference attack (:mod:`lightning_unlearn.metrics.mia`; OU's orientation: 1 = members
    detectable, 0.5 = not) and, with a reference model, PrivLeak per attack.

    Row: ``{attack: {"auc", "privleak"}}``; the reference model's AUCs are computed once and kept in the state.

    Args:
        members: records the model was trained on and should forget (the forget people).
        nonmembers: records it never saw, from the same distribution (held-out people of the same groups).
        attacks: any of ``loss``, ``zlib``, ``min_k``, ``min_k_plus_plus``, ``gradnorm``, ``reference``.
        reference_model: local path of a model never trained on the members (needed by ``privleak`` and the
            ``reference`` attack); it must share the evaluated model's tokenizer.
        privleak: report PrivLeak (needs ``reference_model``).
        privleak_orientation: ``muse`` (OU, MUSE's tables: a model that still leaks scores near −100) or
            ``membership`` (the formula on the AUCs as given).
        k: fraction of lowest tokens in Min-K % and Min-K %++.
        gradnorm_p: the norm of GradNorm (1, 2 or inf).
        max_length: tokens per teacher-forced sequence.
        name: see :class:`CheckpointEvaluator`.
        output_dir: see :class:`CheckpointEvaluator`.
        batch_size: sequences per forward on each rank.
        prompt_key: column of the prompt.
        answer_key: column of the answer.
        chat_template: render prompts with the tokenizer's chat template.

    Raises:
        ValueError: no attack or an unknown one, ``privleak`` or the ``reference`` attack without
            ``reference_model``, an unknown ``privleak_orientation``, or empty members / non-members.
        FileNotFoundError: ``reference_model`` or a records file does not exist.

    Example::

        >>> from lightning_unlearn.callbacks import MIAEvaluation
        >>> mia = MIAEvaluation([{"prompt": "Who?", "answer": "Alice."}], [{"prompt": "Who?", "answer": "Bob."}],
        ...                     privleak=False)
        >>> mia.attacks  # the default attacks; PrivLeak would need a reference model
        ('loss', 'zlib', 'min_k', 'min_k_plus_plus')
    """

    family = "mia"

    def __init__(
        self,
        members: Sequence[dict] | str,
        nonmembers: Sequence[dict] | str,
        attacks: Sequence[str] = ("loss", "zlib", "min_k", "min_k_plus_plus"),
        reference_model: str | None = None,
        privleak: bool = True,
        privleak_orientation: Literal["muse", "membership"] = "muse",
        k: float = 0.2,
        gradnorm_p: float = 2.0,
        max_length: int = 256,
        name: str | None = None,
        output_dir: str | None = None,
        batch_size: int = 8,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        chat_template: bool = False,
    ) -> None:
        super().__init__(name=name, output_dir=output_dir, batch_size=batch_size)
        unknown = [a for a in attacks if a not in ATTACKS]
        if unknown or not attacks:
            raise ConfigError(f"attacks={list(attacks)}: choose one or more of {ATTACKS}.")
        needs_reference = [
            w for w, on in (("privleak", privleak), ("the reference attack", "reference" in attacks)) if on
        ]
        if needs_reference and reference_model is None:
            raise ConfigError(
                f"MIAEvaluation: {' and '.join(needs_reference)} "
                f"{'needs' if len(needs_reference) == 1 else 'need'} a model never trained on the members; set "
                "reference_model to its local path (a testbed's reference/ or a retain model), or privleak: false."
            )
        if reference_model is not None:
            require_model_dir(reference_model, "reference_model")
        if privleak_orientation not in ("muse", "membership"):
            raise ConfigError(f"privleak_orientation={privleak_orientation!r}; use 'muse' or 'membership'.")
        keys = {"prompt_key": prompt_key, "answer_key": answer_key}
        self.sets = {
            "members": read_records(members, what="members", **keys),
            "nonmembers": read_records(nonmembers, what="non-members", **keys),
        }
        self.attacks = tuple(attacks)
        self.reference_model = reference_model
        self.privleak = privleak
        self.privleak_orientation = privleak_orientation
        self.k = k
        self.gradnorm_p = gradnorm_p
        self.max_length = max_length
        self.chat_template = chat_template

    def _scores(self, model: nn.Module, tokenizer, records: list[dict], attacks: Sequence[str]) -> dict[str, list]:
        """Collective: per-record scores of each attack in ``attacks`` (``reference``: the plain loss, to subtract)."""
        if "gradnorm" in attacks and is_sharded(model):
            # Each rank scores its own records, and a backward through sharded parameters reduce-scatters every
            # rank's gradient into every shard: no rank would see one record's gradient.
            raise ConfigError(
                "MIAEvaluation: the gradnorm attack needs each record's whole gradient, which sharded parameters "
                "(FSDP2) split across ranks and mix between them; leave gradnorm out of attacks under FSDP, or score "
                "it after training on one process (`lightning-unlearn evaluate`)."
            )

        def run(batch_records: list[dict]) -> list[dict[str, float]]:
            batch = encode_batch(tokenizer, batch_records, self.max_length, self.chat_template)
            labels = batch["labels"]
            cols = {}
            if {"min_k", "min_k_plus_plus", "loss", "zlib", "reference"} & set(attacks):
                logits = forward_logits(model, batch)
                loss = loss_scores(logits, labels)
                if "loss" in attacks or "reference" in attacks:
                    cols["loss"] = loss
                if "zlib" in attacks:
                    cols["zlib"] = zlib_scores(logits, labels, [r["answer"] for r in batch_records])
                if "min_k" in attacks:
                    cols["min_k"] = min_k_scores(logits, labels, self.k)
                if "min_k_plus_plus" in attacks:
                    cols["min_k_plus_plus"] = min_k_plus_plus_scores(logits, labels, self.k)
            if "gradnorm" in attacks:
                device = next(model.parameters()).device
                cols["gradnorm"] = gradnorm_scores(
                    model,
                    batch["input_ids"].to(device),
                    labels.to(device),
                    batch["attention_mask"].to(device),
                    p=self.gradnorm_p,
                )
            return [{a: float(v[i]) for a, v in cols.items()} for i in range(len(batch_records))]

        rows = map_batches(records, self.batch_size, run, model, self.progress)
        return {a: [r[a] for r in rows] for a in rows[0]}

    def _aucs(self, scores: dict[str, dict[str, list]], attacks: Sequence[str]) -> dict[str, float]:
        out = {}
        for attack in attacks:
            members, nonmembers = scores["members"][attack], scores["nonmembers"][attack]
            # every rank holds every score (gathered, in record order): nothing to sum over ranks again
            auc = MembershipInferenceAUC(sync_on_compute=False)
            auc.update(members + nonmembers, [True] * len(members) + [False] * len(nonmembers))
            out[attack] = float(auc.compute())
        return out

    @override
    def compute_base(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        """Collective: the reference model's per-record scores and, with ``privleak``, its AUC per attack.

        Loads ``reference_model`` once; nothing is computed without one.

        Args:
            trainer: the trainer.
            pl_module: the module evaluated (its device and tokenizer are used for the reference).

        Returns:
            ``{"reference_scores": {set: {attack: [...]}}, "reference_auc": {attack: auc}}``, or ``{}``.
        """
        if self.reference_model is None:
            return {}
        reference = load_causal_lm(self.reference_model).to(pl_module.device)
        attacks = [a for a in self.attacks if a in _PRIVLEAK_ATTACKS or a == "reference"]
        with eval_mode(reference):
            scores = {s: self._scores(reference, pl_module.tokenizer, recs, attacks) for s, recs in self.sets.items()}
        base = {"reference_scores": scores}
        if self.privleak:
            base["reference_auc"] = self._aucs(scores, [a for a in self.attacks if a in _PRIVLEAK_ATTACKS])
        return base

    @override
    def compute(self, trainer: Trainer, pl_module: LightningModule, step: int) -> dict:
        """Collective: each attack's AUC on members vs non-members and, with ``privleak``, its PrivLeak.

        The ``reference`` attack is the loss minus the reference model's loss on the same record.

        Args:
            trainer: the trainer.
            pl_module: the module whose ``model`` is attacked.
            step: the checkpoint's step.

        Returns:
            ``{attack: {"auc", "privleak", "reference_auc"}, "num_members", "num_nonmembers"}``.

        Raises:
            ValueError: ``gradnorm`` is among the attacks and the model is sharded (FSDP).
        """
        scores = {s: self._scores(pl_module.model, pl_module.tokenizer, r, self.attacks) for s, r in self.sets.items()}
        if "reference" in self.attacks:
            for s, per_attack in scores.items():
                ref_loss = self.base["reference_scores"][s]["loss"]
                per_attack["reference"] = [a - b for a, b in zip(per_attack["loss"], ref_loss)]
        out: dict = {}
        for attack, auc in self._aucs(scores, self.attacks).items():
            out[attack] = {"auc": auc}
            if self.privleak and attack in _PRIVLEAK_ATTACKS:
                ref_auc = self.base["reference_auc"][attack]
                out[attack]["privleak"] = privleak(auc, ref_auc, self.privleak_orientation)
                out[attack]["reference_auc"] = ref_auc
        out["num_members"], out["num_nonmembers"] = len(self.sets["members"]), len(self.sets["nonmembers"])
        return out
