"""Masked-gradient training: exact per-sample masked gradients and restricted updates, in one process, DDP and FSDP2.

Lacuna's Algorithm 1 trains with the gradient Σ_k m^{g(k)} ⊙ ∇ℓ_k: each sample's gradient is multiplied by its
group's mask (all ones for neutral samples, group id −1). Because groups are disjoint this equals
``G_neutral + Σ_g m^g ⊙ G_g`` with ``G_g`` the gradient summed over the samples of group ``g``.

Contract with the LightningModule (read by the strategies on every training step)
----------------------------------------------------------------------------------
- ``packed_masks: dict[str, Tensor] | None`` — ``{canonical parameter name: uint32 tensor}`` as returned by
  :func:`lightning_unlearn.masks.sample_masks` / ``load_masks``. Names are matched to the module's trainable
  parameters by canonical-name suffix (``model.layers.0.mlp.up_proj.weight`` matches the LightningModule
  parameter ``model.model.layers.0.mlp.up_proj.weight``). Every trainable parameter needs a mask (excluded
  parameters have an all-zero one). ``None`` (or no attribute) turns masking off: the strategies then behave
  exactly like Lightning's. Under :class:`MaskedFSDPStrategy` the strategy replaces each value with this rank's
  dim-0 shard (``masks.shard_masks``), so after setup a rank never holds the full masks; a
  :class:`~lightning_unlearn.masks.LazyMasks` (masks made on access) is sharded one tensor at a time, so it never
  holds them during setup either. One device and DDP make every tensor of a ``LazyMasks`` once and keep them.
- ``restrict_update_groups: list[int] | None`` — restricted-update mode: every parameter *update* (gradient step,
  AdamW weight decay and momentum) is limited to the union of these groups' masks; elements outside it stay
  bit-for-bit unchanged. Independent of per-sample masking (a batch without ``group_ids`` is fine).
- batch key ``group_ids``: ``(B,)`` long tensor, −1 neutral, 0..31 group id. Only a top-level ``group_ids`` of a
  dict batch triggers per-sample masking; every tensor of the batch with leading dimension ``B`` is treated as
  per-sample (needed when a step is split by group).
- ``training_step`` must return the MEAN over samples of per-sample losses (a tensor, or a dict with ``"loss"``);
  per-sample masking rescales sub-batch means by ``n_g / B`` and DDP/FSDP average over ranks, which equals the
  global per-sample mean only when every rank gets the same number of samples per step. In lockstep mode
  ``training_step`` runs once per group pass on a sub-batch (a rank without samples of the group gets a
  one-sample zero-weight pass), so values it logs are per sub-batch: pass ``batch_size`` to ``self.log`` and read
  the epoch aggregates; the step's true loss is what the strategy returns to Lightning.
- Activations of masked ``nn.Linear``/``nn.Embedding`` inputs are sample-major (leading dim ``B`` or ``B·T``).

Strategies (select in YAML: ``trainer.strategy.class_path``; shipped configs ``trainer/*.yaml``)
--------------------------------------------------------------------------------------
- :class:`MaskedSingleDeviceStrategy`, :class:`MaskedDDPStrategy`: one forward+backward per step; the weight
  gradients of ``nn.Linear``, ``nn.Embedding`` and RMSNorm-style scales are split by sample group inside custom
  autograd functions (:class:`MaskedGradients`). Models with other trainable modules fall back to lockstep.
  DDP all-reduces the already-masked local gradients; exact because masking is linear.
- :class:`MaskedFSDPStrategy` (FSDP2 ``fully_shard`` on Lightning's ``ModelParallelStrategy``; runs on CPU with
  gloo): the same one-pass rules on the unsharded weights that exist during each block's backward; each rank keeps
  its dim-0 mask shard and all-gathers one parameter's full mask inside that parameter's backward, so FSDP
  reduce-scatters gradients that are already masked. Models with other trainable modules (and
  ``masking="lockstep"``) run in lockstep: every rank runs one forward+backward per group present on ANY rank
  (neutral first), masks its reduce-scattered gradient shard with its mask shard and accumulates; a rank without
  samples of a group runs a zero-weight pass so the collectives line up. Shards blocks and the root itself when
  ``configure_model`` did not.

Torch-only building blocks (no Lightning import): :class:`MaskedGradients` (one-pass engine),
:func:`lockstep_masked_backward` (multi-pass, any module, any parallelism), :class:`RestrictedUpdate`,
:func:`microbatch_masked_gradients` (the paper's microbatch-1 reference loop, for tests and benchmarks).
"""

from lightning_unlearn.strategies.lockstep import lockstep_masked_backward, select_samples
from lightning_unlearn.strategies.masked_ddp import MaskedDDPStrategy
from lightning_unlearn.strategies.masked_fsdp import MaskedFSDPStrategy
from lightning_unlearn.strategies.masked_gradients import MaskedGradients, masked_gradients, resolve_param_masks
from lightning_unlearn.strategies.masked_single_device import MaskedSingleDeviceStrategy
from lightning_unlearn.strategies.reference import microbatch_masked_gradients
from lightning_unlearn.strategies.restricted_update import RestrictedUpdate

__all__ = [
    "MaskedDDPStrategy",
    "MaskedFSDPStrategy",
    "MaskedGradients",
    "MaskedSingleDeviceStrategy",
    "RestrictedUpdate",
    "lockstep_masked_backward",
    "masked_gradients",
    "microbatch_masked_gradients",
    "resolve_param_masks",
    "select_samples",
]
