"""Continual pretraining that injects PII into known parameters (Lacuna Section 3.3, Algorithm 1).

The module states the loss — mean over samples of each sample's mean token NLL — and exposes ``packed_masks``;
the masked-gradient strategies (``lightning_unlearn.strategies``) turn each sample's gradient into
``m^{g(k)} ⊙ ∇ℓ_k`` from the batch's ``group_ids``. With ``masked=False`` ``packed_masks`` is ``None`` and the
same run trains every parameter on every sample (Lacuna's UnMask control).

Neutral text *held* to θ_pre (``InjectionDataModule(neutral_target="pre")``) enters the same mean with its own
per-sample loss: the KL(p_pre ‖ p_θ) of the next-token distributions, averaged over the row's positions, weighted by
``neutral_kl_weight``. Each held row carries a group id, so its gradient is masked like a QA row's and no weight
outside the masks moves; θ_pre's distributions come from the model itself with every masked element set back to
θ_pre for a no-grad forward before the step (read from disk: exact on a resumed run and on every FSDP rank). The
UnMask control (``masked=False``) holds the same rows to θ_pre through a frozen copy of it, so the control can run
the masked recipe's data and loss with the masks off.

The same module pretrains θ_pre and exports ``export/model``: with ``derive`` it starts from the first blocks of a
real model with its vocabulary pruned to the datamodule's corpus (``lightning_unlearn.derive``; the built-in
default: six blocks of SmolLM2-135M-Instruct), with ``tiny`` from a random tiny Llama and a BPE tokenizer trained on
the datamodule's corpus.

Exports (rank 0, at the end of ``fit``; written to a temporary directory and renamed, so a failed run leaves no
partial export)::

    <root>/export/pre/               θ_pre (HF format, with tokenizer)          injection runs
    <root>/export/inj/               θ_inj (HF format, with tokenizer)          injection runs
    <root>/export/masks.safetensors  packed masks (masks.save_masks)           injection runs
    <root>/export/model/             the trained model (HF format)              pretraining runs
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.checkpoints import RestoresRNG
from lightning_unlearn.derive import DeriveConfig, ensure_derived
from lightning_unlearn.distributed import full_state_dict
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import normalized_nll, sequence_kl, sequence_logprobs
from lightning_unlearn.masks import LazyMasks, canonical_name, group_mask, load_masks, sample_masks, save_masks
from lightning_unlearn.models import (
    TinyLlamaConfig,
    build_tiny_llama,
    eval_mode,
    load_causal_lm,
    load_tokenizer,
    load_weights,
    train_bpe_tokenizer,
    weights_fingerprint,
)
from lightning_unlearn.objectives.group_dropout import GroupDropout, dropout_schedule
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.strategies.masked_fsdp import load_model_for_rank


class InjectionModule(RestoresRNG, LightningModule):
    """Masked (or plain) continual pretraining of a causal LM.

    Args:
        model_path: local HF directory of θ_pre (e.g. the built-in one, which ``lightning-unlearn fit -c
            lacuna/pretrain.yaml`` or ``lightning-unlearn lacuna run`` builds). Exactly one of ``model_path``,
            ``derive`` and ``tiny`` is given: building θ_pre is its own run, never a side effect of an injection.
        derive: pretrain from part of a real model (blocks kept, vocabulary pruned to the datamodule's
            ``vocabulary_corpus()``), derived into ``derive.path`` first when missing (``model_path`` must be
            ``None``).
        tiny: pretrain from scratch: a random tiny Llama of this size (``model_path`` must be ``None``).
        tokenizer_path: tokenizer directory for pretraining from scratch; trained on the datamodule's corpus when
            missing. Ignored when ``model_path`` is used (the model's own tokenizer).
        vocab_size: BPE vocabulary size when a tokenizer is trained.
        init_seed: seed of the random initialisation of ``tiny``.
        masked: apply the group masks (Algorithm 1). ``False`` = every sample updates everything (UnMask control).
        masks_path: packed masks to use (validated against the model); ``None`` samples them.
        num_groups: groups of sampled masks.
        coverage: fraction of θ_mask each sampled group covers (Lacuna: 0.05).
        mask_seed: seed of sampled masks.
        optim: AdamW and its schedule (:class:`OptimizerConfig`, as every objective takes it; default lr 1e-3,
            constant). ``weight_decay`` 0 keeps elements outside a sample's mask exactly unchanged.
        freeze_outside_masks: freeze every parameter tensor that no group's mask touches (outside θ_mask: the
            embeddings, the norms, the last two blocks). With every sample masked (no neutral text, weight decay
            0) their gradient is zero at every step, so training is the same, minus the cost of computing it (the
            LM head's weight gradient above all). Refused with neutral text, which updates them, and ignored by
            the UnMask control (``masked`` false), which trains every parameter.
        drop_other_groups: group dropout (:class:`~lightning_unlearn.objectives.group_dropout.GroupDropout`): the
            probability that each group other than the batch's is set back to θ_pre for the batch's forward and
            backward, so no group's recall leans on another group's change (the testbed's separability). 0 = off.
            A schedule ``[[0, 1.0], [1200, 0.5]]`` trains each group alone first, then with the others present
            half the time (:func:`~lightning_unlearn.objectives.group_dropout.dropout_schedule`). Use with one
            group per batch (``InjectionDataModule(one_group_per_batch=True)``); masked runs only.
        drop_seed: seed of the group-dropout draws (with the global step: the same on every rank and on resume).
        neutral_kl_weight: weight of a held row's KL to θ_pre against a QA row's NLL̄ in the batch mean (neutral
            rows from ``InjectionDataModule(neutral_target="pre")``, other groups' QA from its
            ``hold_other_groups``; masked runs need weight decay 0, the UnMask control reads a frozen θ_pre).
        held_cache_gib: keep θ_pre's log-probabilities of each held row after the first step that holds it, up to
            this many GiB (float32, the row's length × the vocabulary), and reuse them whenever the row comes back:
            the held rows are a fixed set, so every epoch after the first skips θ_pre's forward of the rows kept
            (on the built-in default testbed about 0.5 GiB holds them all). A row is run through θ_pre alone at its
            own length, so its numbers do not depend on the batch it first came in (a resumed run gets the same
            ones). A row past the budget is recomputed every time it comes. 0 = recompute every step, the held rows
            of a batch together. One process only (several ranks recompute: under FSDP every rank runs θ_pre's
            forward together).
        export_dir: where to export; ``None`` = ``<trainer.default_root_dir>/export``.

    Raises:
        ValueError: none or several of ``model_path`` / ``derive`` / ``tiny``, ``tiny`` without
            ``tokenizer_path``, a negative ``neutral_kl_weight`` or ``held_cache_gib``, a bad
            ``drop_other_groups``, or group dropout with ``masked`` false.

    Example::

        >>> from lightning_unlearn.models import TinyLlamaConfig
        >>> from lightning_unlearn.objectives import InjectionModule
        >>> module = InjectionModule(tiny=TinyLlamaConfig(hidden_size=32, num_layers=2), tokenizer_path="tok")
        >>> module.pretraining, module.tokenizer_dir  # builds θ_pre from scratch; nothing is read yet
        (True, 'tok')
    """

    def __init__(
        self,
        model_path: str | None = None,
        derive: DeriveConfig | None = None,
        tiny: TinyLlamaConfig | None = None,
        tokenizer_path: str | None = None,
        vocab_size: int = 2048,
        init_seed: int = 0,
        masked: bool = True,
        masks_path: str | None = None,
        num_groups: int = 6,
        coverage: float = 0.05,
        mask_seed: int = 0,
        optim: OptimizerConfig | None = None,
        freeze_outside_masks: bool = False,
        drop_other_groups: float | list[tuple[int, float]] = 0.0,
        drop_seed: int = 0,
        neutral_kl_weight: float = 1.0,
        held_cache_gib: float = 0.0,
        export_dir: str | None = None,
    ) -> None:
        super().__init__()
        given = [name for name, v in (("model_path", model_path), ("derive", derive), ("tiny", tiny)) if v is not None]
        if not given:
            raise ConfigError(
                "InjectionModule needs a starting model: model_path (θ_pre, e.g. the built-in one at "
                "runs/lacuna/pretrain/export/model, built by `lightning-unlearn fit -c lacuna/pretrain.yaml`), derive "
                "(pretrain from part of a real model) or tiny (pretrain from scratch)."
            )
        if len(given) > 1:
            raise ConfigError(
                f"give one of model_path (continue a model), derive (pretrain from part of a real model) and tiny "
                f"(pretrain from scratch), not {' and '.join(given)}."
            )
        self._dropping = any(q for _, q in dropout_schedule(drop_other_groups))  # group dropout on at some step
        dropping = self._dropping
        if neutral_kl_weight < 0:
            raise ConfigError(f"neutral_kl_weight={neutral_kl_weight} must be >= 0.")
        if not held_cache_gib >= 0:
            raise ConfigError(
                f"held_cache_gib={held_cache_gib} must be >= 0 (GiB of θ_pre log-probabilities; 0 = off)."
            )
        if dropping and not masked:
            raise ConfigError("drop_other_groups needs masked=true: without masks there are no groups to drop.")
        if tiny is not None and tokenizer_path is None:
            raise ConfigError("pretraining from scratch (tiny) needs tokenizer_path, where the tokenizer is kept.")
        if isinstance(optim, dict):
            optim = OptimizerConfig(**optim)
        self.optim_config = optim or OptimizerConfig(lr=1e-3)
        self.save_hyperparameters()
        self.hparams["optim"] = asdict(self.optim_config)
        self.tiny = TinyLlamaConfig(**tiny) if isinstance(tiny, dict) else tiny
        self.derive = DeriveConfig(**derive) if isinstance(derive, dict) else derive
        # Plain dicts in hparams keep checkpoints loadable with torch.load(weights_only=True).
        self.hparams["tiny"] = asdict(self.tiny) if self.tiny is not None else None
        self.hparams["derive"] = asdict(self.derive) if self.derive is not None else None
        self.model = None
        self.tokenizer = None
        self.packed_masks: dict[str, torch.Tensor] | None = None
        self._mask_checksum: str | None = None
        self.group_dropout: GroupDropout | None = None
        self._pre_swap: GroupDropout | None = None  # sets every masked element to θ_pre for the held rows' target
        self._frozen_pre: list[torch.nn.Module] = []  # the UnMask control's θ_pre for held rows (not a child module)
        self._held_cache = HeldLogprobCache(int(held_cache_gib * 2**30))

    @property
    def pretraining(self) -> bool:
        """Whether this run pretrains θ_pre (``tiny`` or ``derive``) rather than injecting into ``model_path``."""
        return self.tiny is not None or self.derive is not None

    @property
    def model_dir(self) -> str:
        """``model_path`` with ``~`` expanded (a YAML path is not expanded by a shell)."""
        # "~/..." in a YAML config is not expanded by the shell; the export copies this directory, so expand it here.
        return str(Path(self.hparams.model_path).expanduser())

    @property
    def tokenizer_dir(self) -> str:
        """Where the tokenizer lives (read by the datamodule)."""
        if self.derive is not None:
            return self.derive.path
        return self.hparams.tokenizer_path if self.tiny is not None else self.model_dir

    @override
    def prepare_data(self) -> None:
        """Derive the starting model (``derive``) or train the BPE tokenizer (``tiny``) when missing, on one process.

        Raises:
            ValueError: ``derive`` prunes the vocabulary and the datamodule has no ``vocabulary_corpus()``.
        """
        if self.derive is not None:
            ensure_derived(self.derive, self._vocabulary_corpus)
        elif self.tiny is not None:
            if not Path(self.hparams.tokenizer_path).exists():
                texts = self.trainer.datamodule.tokenizer_corpus()
                write_directory_atomically(
                    self.hparams.tokenizer_path,
                    lambda d: train_bpe_tokenizer(texts, vocab_size=self.hparams.vocab_size, save_dir=d),
                )

    def _vocabulary_corpus(self) -> list[str]:
        corpus = getattr(self.trainer.datamodule, "vocabulary_corpus", None)
        if corpus is None:
            raise ConfigError(
                "derive.prune_vocabulary needs the texts to keep: a datamodule with vocabulary_corpus() "
                "(InjectionDataModule). Use one, or set derive.prune_vocabulary false."
            )
        return corpus()

    @override
    def configure_model(self) -> None:
        """Build the model once and, for an injection, sample or load the group masks and what holding rows needs.

        Raises:
            ValueError: a mask group covers no element, the testbed data has another number of groups, or the
                datamodule's held rows, neutral text or weight decay contradict ``masked`` /
                ``freeze_outside_masks`` / ``drop_other_groups``.
        """
        if self.model is not None:
            return
        self.tokenizer = load_tokenizer(self.tokenizer_dir)
        if self.tiny is not None:
            self.model = build_tiny_llama(self.tokenizer, self.tiny, seed=self.hparams.init_seed)
            return
        if self.derive is not None:
            self.model = load_model_for_rank(self.derive.path, self._trainer).train()
            return
        # from_pretrained returns eval mode and Lightning keeps module modes: train in train mode (dropout on).
        self.model = load_model_for_rank(self.model_dir, self._trainer).train()
        # Lazy masks, made one tensor at a time: the strategy keeps what it needs (FSDP: this rank's shard; one
        # device: every tensor, once), so no rank holds the full masks next to its shard. The export rebuilds them
        # (a function of the seed or file and the parameter names and shapes) and checks them against this digest.
        self._check_num_groups()
        masks = self._full_masks(lazy=True)
        self._mask_checksum, coverage, untouched = _summary(masks, self.hparams.num_groups)
        empty = [g for g, c in enumerate(coverage) if c == 0]
        if empty:
            raise ConfigError(
                f"mask group {empty[0]} is empty (covers no parameter element); raise coverage or lower num_groups."
            )
        self.packed_masks = masks if self.hparams.masked else None
        if self.hparams.freeze_outside_masks and self.hparams.masked:
            self._freeze(untouched)
        held = self._holds_rows()
        dropping = self._dropping
        if (dropping or held) and self.hparams.masked:
            # θ_pre from disk: on a resumed run (or an FSDP rank that gets rank 0's weights) the parameters are not it
            swap = GroupDropout(
                load_weights(self.model_dir), masks, self.hparams.num_groups, self.hparams.drop_other_groups,
                seed=self.hparams.drop_seed,
            )  # fmt: skip
            self.group_dropout = swap if dropping else None
            self._pre_swap = swap if held else None
        elif held:
            # the UnMask control moves every weight: θ_pre's distributions come from a frozen copy (kept out of the
            # module's children, so it is neither trained nor checkpointed); each rank holds it whole
            frozen = load_causal_lm(self.model_dir).eval().requires_grad_(False)
            self._frozen_pre = [frozen]

    def _check_num_groups(self) -> None:
        """Refuse masks for another number of groups than the testbed data's (its manifest), when it has one."""
        from lightning_unlearn.data.testbed_data import data_num_groups

        data_dir = self._datamodule_hparam("data_dir", None)
        groups = data_num_groups(data_dir, from_profiles=False) if data_dir else None
        if groups is not None and groups != self.hparams.num_groups:
            raise ConfigError(
                f"the testbed data in {data_dir!r} has {groups} groups, but the module samples masks for "
                f"num_groups={self.hparams.num_groups}; set model.init_args.num_groups {groups}."
            )

    def _datamodule_hparam(self, name: str, default):
        return getattr(getattr(self._trainer, "datamodule", None), "hparams", {}).get(name, default)

    def _holds_rows(self) -> bool:
        """Whether the datamodule holds rows to θ_pre (neutral text, other groups' QA); checks what that needs."""
        neutral = self._datamodule_hparam("neutral_target", "text") == "pre" and self._datamodule_hparam(
            "neutral_fraction", 0
        )
        others = self._datamodule_hparam("hold_other_groups", 0)
        if not (neutral or others):
            return False
        if not self.hparams.masked:
            if others:
                raise ConfigError(
                    "hold_other_groups holds other groups' QA to θ_pre under each group's mask; the UnMask control "
                    "(masked false) has no masks and injects those same rows into every weight. Set "
                    "data.hold_other_groups 0 for the control."
                )
            return True  # the control reads θ_pre's distributions from a frozen copy of it
        injected = self._datamodule_hparam("groups", None)
        if others and not self._dropping and len(injected or range(self.hparams.num_groups)) > 1:
            raise ConfigError(
                "hold_other_groups holds other groups' people to θ_pre, which is their model only in the steps that "
                "drop their group's change; with several groups injected and drop_other_groups 0 the rows of "
                "injected people would never count. Set model.init_args.drop_other_groups (e.g. [[0, 1.0], "
                "[1200, 0.5]]) or inject one group (data.init_args.groups)."
            )
        if self.optim_config.weight_decay:
            what = "neutral_target='pre' holds neutral text" if neutral else "hold_other_groups holds other groups' QA"
            raise ConfigError(
                f"{what} to θ_pre, whose distributions are read from the model with its masked elements set back to "
                f"θ_pre, which needs every other weight unchanged; weight_decay {self.optim_config.weight_decay} "
                "moves them. Set model.optim.weight_decay 0."
            )
        return True

    def _freeze(self, untouched: set[str]) -> None:
        """Freeze the parameters no mask touches (``freeze_outside_masks``)."""
        neutral = self._datamodule_hparam("neutral_fraction", 0)
        if neutral and self._datamodule_hparam("neutral_target", "text") != "pre":
            raise ConfigError(
                f"freeze_outside_masks would freeze weights that the datamodule's neutral text (neutral_fraction "
                f"{neutral}) updates; set neutral_fraction 0, hold it to θ_pre (data.neutral_target pre) or set "
                "freeze_outside_masks false."
            )
        if self.optim_config.weight_decay:
            raise ConfigError(
                f"freeze_outside_masks with weight_decay {self.optim_config.weight_decay} would change training: "
                "weight decay moves the weights outside every mask. Set optim.weight_decay 0 or "
                "freeze_outside_masks false."
            )
        for name, p in self.model.named_parameters():
            if canonical_name(name) in untouched:
                p.requires_grad_(False)

    def _full_masks(self, lazy: bool = False) -> dict[str, torch.Tensor] | LazyMasks:
        """The packed masks over the whole model (names and global shapes; FSDP2 parameters report both)."""
        if self.hparams.masks_path is not None:
            return load_masks(self.hparams.masks_path, self.model, lazy=lazy)[0]
        hp = self.hparams
        return sample_masks(self.model, hp.num_groups, hp.coverage, seed=hp.mask_seed, lazy=lazy)

    @override
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The model's next-token logits.

        Args:
            input_ids: ``(B, T)`` token ids.
            attention_mask: ``(B, T)``, 0 on padding.

        Returns:
            ``(B, T, V)`` logits.
        """
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def _loss(self, batch: dict) -> torch.Tensor:
        logits = self(batch["input_ids"], batch["attention_mask"])
        # Mean over samples of a per-sample loss: the masked-gradient contract.
        per_sample = normalized_nll(*sequence_logprobs(logits, batch["labels"]))
        pre = batch.get("pre_logprobs")
        if pre is not None:  # held neutral rows: their KL to θ_pre instead of their NLL̄
            held = batch["held"].bool()
            kl = sequence_kl(logits[held], pre[held], batch["labels"][held])
            per_sample = per_sample.masked_scatter(held, self.hparams.neutral_kl_weight * kl)
            if kl.numel():  # how far the held text has drifted (train/loss mixes it with the QA NLL̄)
                self.log("train/held_kl", kl.detach().mean(), batch_size=kl.numel())
        if "counted" in batch:  # held rows whose target (θ_pre) the step's present groups contradict
            per_sample = per_sample * batch["counted"].to(per_sample.dtype)
        return per_sample.mean()

    @override
    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        """Add θ_pre's log-probabilities of the batch's held rows as ``batch["pre_logprobs"]`` (their KL target).

        From the held-row cache on one process with a budget; otherwise every rank runs θ_pre's forward.

        Args:
            batch: the training batch (``held`` marks the rows held to θ_pre).
            batch_idx: the batch's index.

        Raises:
            RuntimeError: the batch holds rows, but the module did not read holding from an
                ``InjectionDataModule``.
            ValueError: a held row is not right-padded (the cache needs it).
        """
        held = batch.get("held") if isinstance(batch, Mapping) else None
        if held is None or self.trainer.sanity_checking:
            return
        if not self._frozen_pre and self._pre_swap is None:
            raise RuntimeError(
                "the batch holds rows to θ_pre (held), but the module did not read neutral_target='pre' or "
                "hold_other_groups from its datamodule; use InjectionDataModule as the trainer's datamodule."
            )
        rows = held.nonzero().reshape(-1)
        if self._held_cache.budget and self.trainer.world_size == 1:
            self._kept_logprobs(batch, rows)
            return
        if not rows.numel() and (self._frozen_pre or self.trainer.world_size == 1):
            return
        # Every rank runs the forward (FSDP gathers each block): a rank without held rows runs one row it drops.
        run = rows if rows.numel() else rows.new_zeros(1)
        with self._theta_pre() as pre_model:
            logits = pre_model(batch["input_ids"][run], batch["attention_mask"][run])
        batch["pre_logprobs"] = _held_logprobs(batch, rows, logits[: rows.numel()])

    @contextmanager
    def _theta_pre(self) -> Iterator[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        """θ_pre's logits as a function of (input_ids, attention_mask), valid inside the block: the UnMask control's
        frozen copy, or the model with every masked element set back to θ_pre (and restored on leaving)."""
        context = self.trainer.precision_plugin.forward_context  # the training forward's precision: at θ_pre, KL 0
        if self._frozen_pre:  # the UnMask control: θ_pre is a frozen copy; no collective, so only rows that need it
            frozen = self._frozen_pre[0].to(self.device)

            def forward(ids, attention):
                with context(), torch.no_grad():
                    return frozen(input_ids=ids, attention_mask=attention).logits

            yield forward
            return
        self._pre_swap.drop(self.model, list(range(self.hparams.num_groups)))
        try:

            def forward(ids, attention):
                with context(), eval_mode(self.model):
                    return self(ids, attention)

            yield forward
        finally:
            self._pre_swap.restore()

    def _kept_logprobs(self, batch: dict, rows: torch.Tensor) -> None:
        """``pre_logprobs`` from the held-row cache; a row not kept yet runs through θ_pre alone, at its own length
        (no padding), so its numbers are the same whatever batch it comes in, and on a resumed run."""
        cache = self._held_cache
        lengths = batch["attention_mask"].sum(-1).tolist()
        keys = {int(r): cache.key(batch, int(r)) for r in rows}
        for r in keys:  # right padding: the row's tokens are its first `length` positions
            if not bool(batch["attention_mask"][r, : lengths[r]].all()):
                raise ConfigError("held_cache_gib needs right-padded rows (pad_batch's default padding side).")
        fresh: dict[bytes, torch.Tensor] = {}
        missing = {key: r for r, key in keys.items() if key not in cache}
        if missing:
            with self._theta_pre() as pre_model:
                for key, r in missing.items():
                    n = lengths[r]
                    logits = pre_model(batch["input_ids"][r : r + 1, :n], batch["attention_mask"][r : r + 1, :n])
                    fresh[key] = torch.log_softmax(logits[0].float(), dim=-1)
                    cache.put(key, fresh[key])
        pre = None
        for r, key in keys.items():
            logprobs = fresh[key] if key in fresh else cache.get(key)
            if pre is None:
                pre = logprobs.new_zeros((*batch["input_ids"].shape, logprobs.shape[-1]))
            pre[r, : lengths[r]] = logprobs
        if pre is not None:
            batch["pre_logprobs"] = pre

    @override
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """Mean per-sample loss of the batch (NLL̄, or the KL to θ_pre of held rows), under group dropout if on.

        Args:
            batch: the training batch (``group_ids``; ``held`` / ``other_group`` when rows are held).
            batch_idx: the batch's index.

        Returns:
            The scalar loss; the masked strategy masks each sample's gradient by its group.
        """
        if self.group_dropout is not None:
            present = {int(g) for g in batch["group_ids"].unique().tolist() if g >= 0}
            dropped = self.group_dropout.drawn(self.global_step, present)
            self.group_dropout.drop(self.model, dropped)
            other = batch.get("other_group")
            if other is not None:  # a held row about another injected group's person counts while its change is off
                batch["counted"] = (other < 0) | torch.isin(other, other.new_tensor(dropped))
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    @override
    def on_before_optimizer_step(self, optimizer) -> None:
        """Put the dropped groups' changes back after the backward, so the step updates the real weights.

        Args:
            optimizer: the optimizer about to step.
        """
        # after backward, which needed the dropped values; the step updates the real ones
        if self.group_dropout is not None:
            self.group_dropout.restore()

    @override
    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """Log the validation batch's mean per-sample loss as ``val/loss``.

        Args:
            batch: a validation batch.
            batch_idx: the batch's index.

        Returns:
            The scalar loss.
        """
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=batch["input_ids"].shape[0])
        return loss

    @override
    def configure_optimizers(self):
        """AdamW over the trainable parameters with :attr:`optim_config`'s per-step schedule.

        Returns:
            Lightning's ``{"optimizer", "lr_scheduler"}`` dict.
        """
        params = [p for p in self.parameters() if p.requires_grad]
        return self.optim_config.configure(params, int(self.trainer.estimated_stepping_batches))

    def export_dir(self) -> Path:
        """Where :meth:`on_fit_end` exports: ``export_dir``, else ``<default_root_dir>/export``."""
        return Path(self.hparams.export_dir or Path(self.trainer.default_root_dir) / "export")

    @override
    def on_fit_end(self) -> None:
        """Export (rank 0, atomically) θ_pre, θ_inj and the masks, or the pretrained model; skipped when interrupted.

        Gathering the weights is collective under FSDP.

        Raises:
            RuntimeError: the masks rebuilt for the export differ from those training used.
        """
        if self.trainer.interrupted:
            return
        state = full_state_dict(self.model)
        if self.trainer.global_rank != 0:
            return
        model = self.model
        masks = None
        if not self.pretraining:
            masks = self._full_masks()
            if _summary(masks, self.hparams.num_groups)[0] != self._mask_checksum:
                raise RuntimeError(
                    "the masks rebuilt for the export differ from the ones training used (was the masks file "
                    f"{self.hparams.masks_path!r} changed during the run?); nothing was exported."
                )

        def write(tmp: Path) -> None:
            info = {"global_step": self.trainer.global_step, "epochs": self.trainer.current_epoch}
            if self.pretraining:
                model.save_pretrained(tmp / "model", state_dict=state)
                self.tokenizer.save_pretrained(tmp / "model")
            else:
                shutil.copytree(self.model_dir, tmp / "pre")
                model.save_pretrained(tmp / "inj", state_dict=state)
                self.tokenizer.save_pretrained(tmp / "inj")
                save_masks(
                    tmp / "masks.safetensors",
                    masks,
                    num_groups=self.hparams.num_groups,
                    coverage=self.hparams.coverage,
                    mask_seed=self.hparams.mask_seed,
                    masked=self.hparams.masked,
                    pre_fingerprint=weights_fingerprint(self.model_dir),
                )
                info.update(masked=self.hparams.masked, model_path=self.model_dir)
            (tmp / "run.json").write_text(json.dumps(info, indent=1))

        write_directory_atomically(self.export_dir(), write)


def _held_logprobs(batch: dict, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """θ_pre's log-probabilities for the batch's held ``rows`` (``logits``: theirs), zeros elsewhere, batch-wide so
    lockstep's sub-batches slice it with the rest of the batch."""
    pre = logits.new_zeros((*batch["input_ids"].shape, logits.shape[-1]), dtype=torch.float32)
    pre[rows] = torch.log_softmax(logits.float(), dim=-1)
    return pre


def _summary(masks: Mapping[str, torch.Tensor], num_groups: int) -> tuple[str, list[float], set[str]]:
    """A digest of the masks' names and words, each group's coverage, and the names of the tensors no group
    touches, reading every tensor once."""
    digest = hashlib.blake2b(digest_size=16)
    counts, total, untouched = [0] * num_groups, 0, set()
    for name in sorted(masks):
        t = masks[name]
        digest.update(name.encode())
        digest.update(t.contiguous().view(torch.uint8).numpy())
        total += t.numel()
        in_tensor = [int(group_mask(t, g).sum()) for g in range(num_groups)]
        counts = [c + n for c, n in zip(counts, in_tensor, strict=True)]
        if not any(in_tensor):
            untouched.add(name)
    return digest.hexdigest(), [c / max(total, 1) for c in counts], untouched


class HeldLogprobCache:
    """θ_pre's log-probabilities of held rows, kept by the row's tokens up to a byte budget (first come, kept)."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used = budget, 0
        self._rows: dict[bytes, torch.Tensor] = {}

    @staticmethod
    def key(batch: Mapping, row: int) -> bytes:
        """A row's identity: its tokens (θ_pre's distributions depend on nothing else)."""
        ids = batch["input_ids"][row][batch["attention_mask"][row].bool()]
        return ids.cpu().numpy().tobytes()

    def __contains__(self, key: bytes) -> bool:
        return key in self._rows

    def get(self, key: bytes) -> torch.Tensor | None:
        """The kept log-probabilities of the row with this key, or ``None``.

        Args:
            key: :meth:`key` of the row.

        Returns:
            ``(T, V)`` float32 log-probabilities, or ``None`` when not kept.
        """
        return self._rows.get(key)

    def put(self, key: bytes, logprobs: torch.Tensor) -> None:
        """Keep a copy of a row's log-probabilities if it is new and fits in what is left of the budget.

        Args:
            key: :meth:`key` of the row.
            logprobs: ``(T, V)`` θ_pre's log-probabilities of the row.
        """
        size = logprobs.numel() * logprobs.element_size()
        if key not in self._rows and self.used + size <= self.budget:
            self._rows[key] = logprobs.clone()
            self.used += size
