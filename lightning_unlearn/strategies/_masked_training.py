"""What the three masked strategies share, by composition: read the LightningModule's contract (``packed_masks``,
``restrict_update_groups``, batch ``group_ids``), choose one-pass or lockstep, and wrap the optimizer step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_unlearn.distributed import local_view
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import LazyMasks
from lightning_unlearn.strategies.lockstep import lockstep_masked_backward, loss_with_gradients
from lightning_unlearn.strategies.masked_gradients import MaskedGradients, resolve_param_masks
from lightning_unlearn.strategies.restricted_update import RestrictedUpdate

Masking = Literal["auto", "one_pass", "lockstep"]
MASKING_MODES = ("auto", "one_pass", "lockstep")


def check_masking(masking: str) -> str:
    """``masking`` when it is a known mode.

    Args:
        masking: ``auto``, ``one_pass`` or ``lockstep``.

    Raises:
        ValueError: any other value.
    """
    if masking not in MASKING_MODES:
        raise ConfigError(f"masking={masking!r} is not one of {MASKING_MODES}.")
    return masking


class MaskedTraining:
    """Per-strategy state: the engine for the module's current masks and the restricted-update helper.

    Args:
        masking: ``"one_pass"`` (custom autograd rules), ``"lockstep"`` (a pass per group) or ``"auto"``
            (one pass when every trainable module has a rule).
        shard: maps full packed masks to this rank's shards (FSDP); ``None`` keeps them whole.
        local_shape: a parameter's local data shape (FSDP: the shard's), to check masks against.
        sync_accumulated: lockstep under a data-parallel wrapper that skips the gradient sync of accumulating
            batches (DDP's ``no_sync``): given the gradients accumulated before this batch, reduces them in place
            when this batch is the one that syncs (they were left local), else leaves them. ``None``: nothing to do.
    """

    def __init__(
        self,
        masking: str,
        shard: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
        local_shape: Callable[[torch.nn.Parameter], tuple[int, ...]] | None = None,
        sync_accumulated: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> None:
        self.masking = check_masking(masking)
        self._sync_accumulated = sync_accumulated
        self._shard = shard
        self._local_shape = local_shape or (lambda p: tuple(p.shape))
        self._source: Mapping[str, torch.Tensor] | None = None
        self._engine: MaskedGradients | None = None
        self._engine_checked = False
        self._param_masks: dict[torch.nn.Parameter, torch.Tensor] = {}
        self._restrict: RestrictedUpdate | None = None
        self._restrict_key: tuple | None = None

    def prepare(self, module: LightningModule) -> dict[torch.nn.Parameter, torch.Tensor] | None:
        """Resolve (and under FSDP shard) the module's current ``packed_masks``; ``None`` when masking is off."""
        packed = getattr(module, "packed_masks", None)
        if packed is None:
            self._source, self._engine, self._param_masks = None, None, {}
            return None
        if packed is self._source:
            return self._param_masks
        if self._shard is not None and not getattr(packed, "is_local_shard", False):
            # One tensor at a time: with LazyMasks the full masks never exist on this rank.
            packed = _ShardDict(self._shard(packed))
            module.packed_masks = packed  # the full masks are dropped: a rank keeps only its shard
        elif isinstance(packed, LazyMasks):
            packed = dict(packed)  # read every step: make each tensor once
            module.packed_masks = packed
        keys = resolve_param_masks(module, packed)
        masks = {}
        for p, k in keys.items():
            mask = packed[k].to(local_device(p))
            if tuple(mask.shape) != self._local_shape(p):
                raise ConfigError(
                    f"mask {k!r} has shape {tuple(mask.shape)} but the parameter's local data has "
                    f"{self._local_shape(p)}; the masks were made for another model."
                )
            masks[p] = mask
        self._param_masks = masks
        self._engine = None  # built on the first batch with group_ids (restricted-only runs never need it)
        self._engine_checked = False
        self._source = packed
        self._restrict_key = None
        return masks

    def _one_pass_engine(self, module: LightningModule) -> MaskedGradients | None:
        if self._engine_checked:
            return self._engine
        self._engine_checked = True
        if self.masking == "lockstep":
            return None
        engine = MaskedGradients(module, self._source)
        if engine.one_pass:
            self._engine = engine
        elif self.masking == "one_pass":
            raise ConfigError(
                f"masking='one_pass' cannot split the gradients of {engine.unsupported[:3]} per sample; "
                "use masking='auto' or 'lockstep'."
            )
        return self._engine

    @override
    def training_step(
        self, module: LightningModule, call: Callable[..., Any], backward: Callable[[torch.Tensor], None], args, kwargs
    ) -> Any:
        """Run ``call(*args, **kwargs)`` (the strategy's plain training step) with per-sample masking.

        One pass: the masking happens inside the backward that Lightning runs on the returned loss. Lockstep: the
        passes (each a ``call`` on a sub-batch and a ``backward``) run here, and the returned loss is the step's
        mean loss whose gradient is the masked gradient, so Lightning's own zero_grad and backward deliver it.
        """
        masks = self.prepare(module)
        batch = args[0] if args else None
        group_ids = batch.get("group_ids") if isinstance(batch, Mapping) else None
        if masks is None or group_ids is None:
            return call(*args, **kwargs)
        engine = self._one_pass_engine(module)
        if engine is not None:
            with engine.batch(group_ids):
                return call(*args, **kwargs)
        if not module.automatic_optimization:
            raise RuntimeError(
                "lockstep masked gradients run the backward themselves and need automatic optimization; "
                "set automatic_optimization=True or use a model whose modules all have one-pass rules."
            )

        def forward_loss(sub_batch):
            out = call(sub_batch, *args[1:], **kwargs)
            loss = out["loss"] if isinstance(out, Mapping) else out
            if not isinstance(loss, torch.Tensor):
                raise RuntimeError("training_step must return the mean loss (a tensor or a dict with 'loss').")
            return loss

        # The passes leave their gradients in .grad; take them out (Lightning zeroes .grad before its backward) and
        # put back what .grad held before (earlier batches of an accumulation), which the backward then adds to.
        prior = {p: p.grad for p in masks}
        for p in masks:
            p.grad = None
        if self._sync_accumulated is not None:
            # Under DDP the earlier batches of an accumulation ran in no_sync and left their gradients local; one
            # pass's backward would have synced them with its own, but they are out of .grad during the passes.
            self._sync_accumulated([g for g in prior.values() if g is not None])
        loss = lockstep_masked_backward(forward_loss, backward, batch, group_ids, masks, process_group=None)
        gradients = {p: p.grad for p in masks}
        for p, g in prior.items():
            p.grad = g
        return loss_with_gradients(loss, gradients)

    def restriction(self, module: LightningModule) -> RestrictedUpdate | None:
        """The restricted-update helper for the module's ``restrict_update_groups``, or ``None`` when it has none.

        Rebuilt when the masks or groups change.

        Args:
            module: the LightningModule being trained.

        Raises:
            ValueError: ``restrict_update_groups`` is set but ``packed_masks`` is ``None``.
        """
        groups = getattr(module, "restrict_update_groups", None)
        if groups is None:
            self._restrict = None
            return None
        masks = self.prepare(module)
        if masks is None:
            raise ConfigError(
                "restrict_update_groups is set but the module's packed_masks is None; load or sample the masks "
                "(masks.load_masks) and set module.packed_masks."
            )
        key = (id(self._source), tuple(sorted(groups)))
        if self._restrict is None or key != self._restrict_key:
            self._restrict = RestrictedUpdate(masks, groups)
            self._restrict_key = key
        return self._restrict

    @override
    def optimizer_step(self, module: LightningModule, step: Callable[[Callable[[], Any]], Any], closure) -> Any:
        """``step(closure)`` with gradients masked after the closure and out-of-mask values restored after."""
        restrict = self.restriction(module)
        if restrict is None:
            return step(closure)

        def restricted_closure():
            out = closure()
            restrict.mask_grads()
            restrict.snapshot()
            return out

        out = step(restricted_closure)
        restrict.restore()
        return out


class _ShardDict(dict):
    """A dict of packed-mask shards (marks that sharding happened)."""

    is_local_shard = True


def local_device(p: torch.Tensor) -> torch.device:
    """The device of a parameter's local data (its shard under FSDP2)."""
    return local_view(p).device


class MaskedStrategyHooks:
    """The two Strategy hooks every masked strategy overrides, written once; Lightning's ``backward`` is not one.

    Listed before the Lightning strategy in the bases (``class MaskedDDPStrategy(MaskedStrategyHooks, DDPStrategy)``),
    so ``super()`` here reaches that strategy's own hook. The subclass sets ``self.masked`` (a :class:`MaskedTraining`).
    """

    masked: MaskedTraining

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The strategy's training step with per-sample masked gradients (:meth:`MaskedTraining.training_step`)."""
        backward = lambda loss: self.precision_plugin.backward(loss, self.lightning_module, None)  # noqa: E731
        return self.masked.training_step(self.lightning_module, super().training_step, backward, args, kwargs)

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        """The strategy's optimizer step, confined to the restricted groups' masks when the module asks for it."""
        parent_step = super().optimizer_step
        step = lambda c: parent_step(optimizer, c, model, **kwargs)  # noqa: E731
        return self.masked.optimizer_step(self.lightning_module, step, closure)
