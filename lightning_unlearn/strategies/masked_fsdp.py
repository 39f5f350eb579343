"""FSDP2 strategy (``fully_shard`` on Lightning's ``ModelParallelStrategy``) with per-sample masked gradients.

Each rank holds only its dim-0 shard of the packed masks (``torch.chunk``, like FSDP2's ``Shard(0)``). By default
(``masking="auto"``) a step is one forward+backward: the one-pass rules of
:class:`~lightning_unlearn.strategies.MaskedGradients` mask each rank's gradient of the unsharded weight inside the
backward, with the parameter's full mask all-gathered just for that backward, before FSDP's reduce-scatter sums
the ranks' masked gradients. Models with trainable modules that have no one-pass rule (and ``masking="lockstep"``)
run in lockstep instead: every rank runs one forward+backward per group present on any rank and masks its
reduce-scattered gradient shard with its mask shard (see
:func:`lightning_unlearn.strategies.lockstep_masked_backward`).

Runs on CPU with gloo (Lightning's ``strategy="fsdp"`` refuses CPU). When the LightningModule's ``configure_model``
did not shard anything, every transformer block and then each top-level child module is ``fully_shard``-ed over
the data-parallel mesh.

Only rank 0 needs to read the weights: a module that builds its model with :func:`load_model_for_rank` gets a
meta-device skeleton on the other ranks, and setup broadcasts rank 0's state (and buffers) into every rank's shards
after sharding. Masks given as :class:`lightning_unlearn.masks.LazyMasks` are made and sharded one tensor at a time.
"""

from __future__ import annotations

import itertools
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch

# private: Lightning's meta-device materialisation (to_empty + reset_parameters) has no public entry point
from lightning.fabric.utilities.init import _materialize_distributed_module

# private: moving optimizer state to a device has no public helper in Lightning or torch
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.constants import default_pg_timeout
from typing_extensions import override

from lightning_unlearn.distributed import local_view
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import shard_masks
from lightning_unlearn.models import load_causal_lm
from lightning_unlearn.strategies._masked_training import MaskedStrategyHooks, MaskedTraining, Masking

_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.\d+$")


class MaskedFSDPStrategy(MaskedStrategyHooks, ModelParallelStrategy):
    """FSDP2 data parallelism plus the LightningModule contract of :mod:`lightning_unlearn.strategies`.

    Sharded checkpoints may omit model keys: a module whose checkpoints drop its frozen weights (an adapter's base
    model, which ``model_path`` supplies again) loads back here, and its ``load_state_dict`` decides which missing
    keys are acceptable (:attr:`loads_partial_sharded_checkpoints`). Lightning's own loader requests every key.

    Args:
        data_parallel_size: ranks that shard the model; ``"auto"`` means all of them (no tensor parallelism).
        save_distributed_checkpoint: each rank saves its own shard (``True``) or rank 0 saves full weights.
        process_group_backend: ``"gloo"`` for CPU, ``"nccl"`` for GPUs; ``None`` picks by accelerator.
        masking: ``"auto"`` (one pass when every trainable module has a rule, else lockstep), ``"one_pass"``
            or ``"lockstep"``.
        reshard_after_forward: passed to ``fully_shard`` when this strategy shards the module (free each block's
            unsharded weights after its forward and all-gather them again for the backward, or keep them).
        timeout: collective timeout.
    """

    def __init__(
        self,
        data_parallel_size: Literal["auto"] | int = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        masking: Masking = "auto",
        reshard_after_forward: bool = True,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.masked = MaskedTraining(masking, shard=self._shard_masks, local_shape=_local_shape)
        self.reshard_after_forward = reshard_after_forward

    #: :meth:`load_checkpoint` accepts sharded checkpoints that lack some model keys.
    loads_partial_sharded_checkpoints = True

    @override
    def setup_environment(self) -> None:
        """Resolve ``data_parallel_size="auto"`` to nodes × processes (known only now); then Lightning's setup."""
        # private: ModelParallelStrategy's "auto" means num_nodes; num_processes is known only now, and no setter exists
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def _shard_masks(self, packed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mesh = self.device_mesh["data_parallel"]
        return shard_masks(packed, mesh.get_local_rank(), mesh.size())

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        """``ModelParallelStrategy.setup``, except that an unsharded module is sharded here and rank 0's weights
        are broadcast to ranks that built meta skeletons; then the masks are resolved and sharded.

        Args:
            trainer: the trainer.

        Raises:
            TypeError: the model uses FSDP1 (``FullyShardedDataParallel``), not FSDP2.
            RuntimeError: rank 0 built its model on the meta device.
        """
        # ModelParallelStrategy.setup (Lightning 2.6), step for step, with three differences no hook can make:
        # - it refuses a module without its own `configure_model` sharding; every objective here is sharded by the
        #   strategy (`_fully_shard`), so a user's LightningModule needs no FSDP code;
        # - where rank 0 alone holds the loaded weights (`_weights_from_rank0`), the other ranks allocate empty shards
        #   and receive rank 0's values, instead of materializing the meta shards with reset_parameters;
        # - the masks are prepared on the sharded module (`self.masked.prepare`) before the optimizer is built.
        # Lightning calls `setup` as one piece (no hook between its materialization and its optimizer setup), so the
        # copy is the way in; tests/strategies compare the result with one process under DDP and FSDP.
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        assert self.model is not None and self.accelerator is not None
        self.accelerator.setup(trainer)
        if any(isinstance(m, FullyShardedDataParallel) for m in self.model.modules()):
            raise TypeError(f"{type(self).__name__} supports FSDP2 (fully_shard) only, not FullyShardedDataParallel.")
        module = self.lightning_module
        from_rank0 = self._weights_from_rank0(module)
        full = module.state_dict() if from_rank0 and self.global_rank == 0 else None
        if not any(isinstance(m, FSDPModule) for m in self.model.modules()):
            self._fully_shard(module)
        if from_rank0:
            # Allocate the meta shards without initialising them (reset_parameters on DTensors is collective and
            # rank 0 has nothing to reset); every value then comes from rank 0.
            if self.global_rank != 0:
                module.to_empty(device=self.root_device)
            self._broadcast_rank0_weights(module, full)
            del full
        else:
            _materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.barrier()
        self.masked.prepare(self.lightning_module)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    @override
    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Load a single-file checkpoint as Lightning does, or a sharded one that may lack the frozen weights.

        Args:
            checkpoint_path: the checkpoint file or sharded directory (rank 0's path is used).
            weights_only: passed to ``torch.load``.

        Returns:
            The checkpoint's non-model state.
        """
        # private: Lightning's saver (not overridden) decides the sharded layout; its own test has no public name
        from lightning.fabric.strategies.model_parallel import _is_sharded_checkpoint

        path = Path(self.broadcast(checkpoint_path))
        if not _is_sharded_checkpoint(path):
            return super().load_checkpoint(path, weights_only=weights_only)
        return _load_sharded_checkpoint(
            path, self.model, self.optimizers, strict=self.lightning_module.strict_loading, weights_only=weights_only
        )

    def _weights_from_rank0(self, module: torch.nn.Module) -> bool:
        """Whether some rank built its model on the meta device (:func:`load_model_for_rank`), so that rank 0's
        weights must be broadcast after sharding. Collective."""
        import torch.distributed as dist

        meta = any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers()))
        # [some rank is on meta, rank 0 is]: every rank joins the reduction before any of them may raise
        flags = torch.tensor([int(meta), int(meta and self.global_rank == 0)], device=self.root_device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[1]:
            raise RuntimeError(
                "rank 0 built its model on the meta device; rank 0 must read the weights that the other ranks receive "
                "(load it with load_model_for_rank in configure_model)."
            )
        return bool(flags[0])

    def _broadcast_rank0_weights(self, module: torch.nn.Module, full: dict[str, torch.Tensor] | None) -> None:
        """Fill every rank's shards from rank 0's full state dict, then copy rank 0's buffers (non-persistent ones,
        such as rotary frequencies, are in no state dict and were left uninitialised by materialisation)."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(module, full if full is not None else {}, options=options)
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)

    def _fully_shard(self, module: torch.nn.Module) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for name, sub in module.named_modules():
            if _BLOCK.search(name) and any(True for _ in sub.parameters()):
                fully_shard(sub, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        if any(True for _ in module.parameters(recurse=False)):
            raise ConfigError(
                f"{type(module).__name__} has parameters of its own; MaskedFSDPStrategy shards child modules only. "
                "Move them into a submodule or shard in configure_model()."
            )
        for child in module.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh, reshard_after_forward=self.reshard_after_forward)


def _load_sharded_checkpoint(
    path: Path, module: torch.nn.Module, optimizers: list, strict: bool, weights_only: bool | None
) -> dict[str, Any]:
    """Lightning's sharded-checkpoint load (model, optimizers, then ``meta.pt``), except that model keys absent
    from the checkpoint are not requested: ``module.load_state_dict`` gets only the saved keys and decides (with
    ``strict``) whether the missing ones are acceptable."""
    import torch.distributed.checkpoint as dcp

    # private: the metadata file name Lightning's sharded saver (not overridden) writes; no public constant
    from lightning.fabric.utilities.load import _METADATA_FILENAME
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    model_state = {k: v for k, v in get_model_state_dict(module).items() if f"state_dict.{k}" in saved}
    dcp.load({"state_dict": model_state}, checkpoint_id=path)
    module.load_state_dict(model_state, strict=strict)
    for idx, optimizer in enumerate(optimizers):
        optim_state = {f"optimizer_{idx}": get_optimizer_state_dict(module, optimizer)}
        dcp.load(optim_state, checkpoint_id=path)
        set_optimizer_state_dict(
            module,
            optimizer,
            optim_state_dict=optim_state[f"optimizer_{idx}"],
            options=StateDictOptions(cpu_offload=True),
        )
    return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)


def _local_shape(p: torch.Tensor) -> tuple[int, ...]:
    return tuple(local_view(p).shape)


def load_model_for_rank(path: str, trainer: pl.Trainer | None) -> torch.nn.Module:
    """``load_causal_lm(path)`` for ``configure_model``; on ranks > 0 under :class:`MaskedFSDPStrategy` only its
    meta-device skeleton (``weights=False``).

    The strategy broadcasts rank 0's weights into the other ranks' shards after sharding, so a large model is read
    from disk and held in full by one process rather than by every rank.
    """
    if trainer is None or not isinstance(trainer.strategy, MaskedFSDPStrategy) or trainer.global_rank == 0:
        return load_causal_lm(path)
    rank = trainer.global_rank
    logging.getLogger("lightning_unlearn").info(
        "rank %d: model built on the meta device; its shards are broadcast from rank 0", rank
    )
    return load_causal_lm(path, weights=False)
