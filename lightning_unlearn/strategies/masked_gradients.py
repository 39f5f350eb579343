"""One forward+backward that yields the exact per-sample masked gradient Σ_k m^{g(k)} ⊙ ∇ℓ_k (Lacuna Algorithm 1).

Groups are disjoint, so the gradient is ``G_neutral + Σ_g m^g ⊙ G_g`` where ``G_g`` sums the gradients of the
samples of group ``g``. Each supported module's forward is replaced (only inside :meth:`MaskedGradients.batch`)
by a custom autograd function whose backward computes these per-group sums directly:

- ``nn.Linear``: ``G_g = δ_gᵀ x_g`` over the rows of group ``g`` — the weight-gradient matmul split by sample
  group, the same FLOPs as the unmasked ``δᵀ x``; ``grad_input = δ W`` as usual.
- ``nn.Embedding``: ``embedding_dense_backward`` on each group's rows.
- RMSNorm-style scales (``weight * x``): the weight enters as a per-sample expanded view ``(B, 1…, H)``, whose
  gradient is the per-sample gradient (``B·H`` numbers), reduced per group.

Masks come from the packed uint32 tensors (the source of truth). By default each parameter keeps, per group it
contains, the int32 flat indices of its masked elements (:class:`ParamMask`; 1.2 bytes per θ_mask element
for 6 groups at 5% coverage), so ``grad += m^g ⊙ G_g`` is a gather/scatter over 5% of the elements; with
``index_cache=False`` the bits are decoded on every backward instead (``(packed & bit) != 0`` through an int32
view). A group with no element in a parameter costs nothing there, so parameters outside θ_mask only compute the
neutral rows' gradient — cheaper than the unmasked step. Measured on a CPU (``benchmarks/masked_step.py``):
the masked step costs about the same as the unmasked one.

Under FSDP2 the same rules run on the *unsharded* weights that exist during each block's forward and backward:
the gradient a rank computes is the masked sum over its own samples for the whole weight, and FSDP's
reduce-scatter then sums the ranks' already-masked gradients — exact because masking is linear. Each rank keeps
only its dim-0 shard of the packed masks (:class:`ShardedParamMask`, 4 bytes per local element); the full mask
of one parameter is all-gathered inside that parameter's backward and freed after it, so the transient peak is
the largest single parameter's mask. Whether a parameter needs its mask this step is decided from the groups
present on *any* rank (one small all-reduce per step), so every rank issues the same gathers in the same order.

This module imports torch only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import MAX_GROUPS, NEUTRAL_GROUP, canonical_name, groups_in_mask

# Decoding reads the uint32 masks through an int32 view: torch's uint32 kernels are not vectorised on the CPU
# (``packed & bit`` is ~30x slower than the int32 equivalent). Bit 31 is the int32 sign bit.
_BITS32 = [torch.tensor((1 << g) - (1 << 32) * (g == 31), dtype=torch.int32) for g in range(MAX_GROUPS)]


def resolve_param_masks(module: nn.Module, packed: Mapping[str, torch.Tensor]) -> dict[nn.Parameter, str]:
    """Map every trainable parameter of ``module`` to the key of its mask in ``packed``.

    A parameter named ``a.b.model.layers.0.q_proj.weight`` matches the key ``model.layers.0.q_proj.weight``
    (canonical names, dot-boundary suffix), so masks sampled on the bare HF model apply to a LightningModule that
    holds it, through peft or FSDP wrapping. Tied parameters are resolved once.

    Raises:
        ValueError: a trainable parameter has no mask, or matches several.
    """
    out: dict[nn.Parameter, str] = {}
    keys = list(packed)
    for name, p in module.named_parameters(remove_duplicate=False):
        if not p.requires_grad or p in out:
            continue
        cname = canonical_name(name)
        if cname in packed:
            out[p] = cname
            continue
        hits = [k for k in keys if cname.endswith("." + k)]
        if not hits:
            raise ConfigError(
                f"trainable parameter {name!r} has no packed mask. Sample the masks on this model "
                "(masks.sample_masks) or freeze the parameter (requires_grad=False)."
            )
        if len(hits) > 1:
            raise ConfigError(f"trainable parameter {name!r} matches several masks {hits}; mask names are ambiguous.")
        out[p] = hits[0]
    return out


def decode(packed: torch.Tensor, group: int) -> torch.Tensor:
    """Bool mask of ``group`` in one packed uint32 tensor (no validation; the hot path)."""
    return (packed.view(torch.int32) & _BITS32[group].to(packed.device)) != 0


def decode_union(packed: torch.Tensor, groups: Iterable[int]) -> torch.Tensor:
    """Bool mask of the union of ``groups`` (e.g. m^F = groups 0-2) in one packed uint32 tensor."""
    bits = sum(1 << g for g in set(groups))
    bits32 = torch.tensor(bits - (1 << 32) * (bits >= 1 << 31), dtype=torch.int32, device=packed.device)
    return (packed.view(torch.int32) & bits32) != 0


def groups_present(group_ids: torch.Tensor, process_group: Any = None) -> list[int]:
    """Group ids (−1 first, then ascending) present in ``group_ids`` on any rank of ``process_group``."""
    present = torch.zeros(MAX_GROUPS + 1, dtype=torch.int64)
    ids = torch.as_tensor(group_ids).reshape(-1).cpu().long()
    if ids.numel() and (int(ids.min()) < NEUTRAL_GROUP or int(ids.max()) >= MAX_GROUPS):
        raise ConfigError(f"group_ids must lie in -1..{MAX_GROUPS - 1}, got {sorted(set(ids.tolist()))}.")
    present[ids + 1] = 1
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1:
        nccl = dist.get_backend(process_group) == "nccl"
        buf = present.to(torch.device("cuda", torch.cuda.current_device())) if nccl else present
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=process_group)
        present = buf.cpu()
    return [g - 1 for g in range(MAX_GROUPS + 1) if present[g]]


@dataclass
class Samples:
    """Sample indices of one group: an index tensor and the same as contiguous ``[start, stop)`` runs."""

    idx: torch.Tensor
    runs: list[tuple[int, int]]

    @classmethod
    def of(cls, idx: torch.Tensor) -> Samples:
        """The samples at ``idx`` (ascending) with their contiguous runs.

        Args:
            idx: ``(n,)`` sample indices, ascending.
        """
        runs: list[tuple[int, int]] = []
        for i in idx.tolist():
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        return cls(idx, runs)


@dataclass
class SampleGroups:
    """A batch's ``group_ids`` split by group.

    Attributes:
        batch_size: B.
        neutral: the neutral samples, ``None`` if there are none.
        groups: ``(group id, samples)`` for each group present, ascending.
    """

    batch_size: int
    neutral: Samples | None
    groups: list[tuple[int, Samples]] = field(default_factory=list)

    @property
    def all_neutral(self) -> bool:
        """Whether no sample of the batch belongs to a group."""
        return not self.groups

    @classmethod
    def from_group_ids(cls, group_ids: torch.Tensor) -> SampleGroups:
        """Split a batch by its ``group_ids`` (−1 = neutral).

        Args:
            group_ids: ``(B,)`` group id per sample.

        Raises:
            ValueError: an id below −1 or at least ``MAX_GROUPS``.
        """
        group_ids = torch.as_tensor(group_ids).reshape(-1).to("cpu", torch.long)
        if group_ids.numel() and (int(group_ids.min()) < NEUTRAL_GROUP or int(group_ids.max()) >= MAX_GROUPS):
            raise ConfigError(
                f"group_ids must lie in -1..{MAX_GROUPS - 1} (-1 = neutral), got values "
                f"{sorted(set(group_ids.tolist()))}."
            )
        neutral = (group_ids == NEUTRAL_GROUP).nonzero().reshape(-1)
        groups = [
            (g, Samples.of((group_ids == g).nonzero().reshape(-1))) for g in sorted(set(group_ids.tolist()) - {-1})
        ]
        return cls(int(group_ids.numel()), Samples.of(neutral) if neutral.numel() else None, groups)


class ParamMask:
    """One parameter's packed mask, the groups it contains, and (optionally) each group's flat element indices.

    The index cache (int32, sorted) costs 4 bytes per masked element — ``4 · Σ_g coverage_g`` bytes per parameter
    element, 1.2 bytes for 6 groups at 5% — and turns ``grad += m^g ⊙ G_g`` into a gather/scatter over the
    masked elements only, instead of three full-size elementwise passes per group. It is derived from the packed
    tensor, which stays the source of truth.

    Args:
        packed: uint32 tensor of the parameter's shape.
        index_cache: build the per-group index cache.
    """

    __slots__ = ("packed", "present", "indices")

    def __init__(self, packed: torch.Tensor, index_cache: bool = True, present: frozenset[int] | None = None) -> None:
        self.packed = packed
        self.present = groups_in_mask(packed) if present is None else present
        self.indices: dict[int, torch.Tensor] | None = None
        if index_cache:
            self.indices = {
                g: decode(packed, g).reshape(-1).nonzero().reshape(-1).to(torch.int32) for g in sorted(self.present)
            }

    @property
    def cache_bytes(self) -> int:
        """Bytes of the per-group index cache (0 without it)."""
        return sum(t.numel() * t.element_size() for t in (self.indices or {}).values())

    @property
    def shape(self) -> torch.Size:
        """The parameter's shape."""
        return self.packed.shape

    def full(self) -> ParamMask:
        """The mask of the whole parameter: this one (see :meth:`ShardedParamMask.full`)."""
        return self

    def add_masked(self, grad: torch.Tensor, contribution: torch.Tensor, group: int) -> None:
        """``grad += m^group ⊙ contribution`` in place (``grad`` contiguous)."""
        if self.indices is not None:
            idx = self.indices[group]
            grad.view(-1).index_add_(0, idx, contribution.reshape(-1).index_select(0, idx))
        else:
            grad.add_(torch.where(decode(self.packed, group), contribution, 0))


class ShardedParamMask:
    """One FSDP2 parameter's packed mask, held as this rank's dim-0 shard (``torch.chunk``, FSDP2's ``Shard(0)``).

    :meth:`full` all-gathers the whole packed mask over ``group`` — a collective every rank of the group must call
    for the same parameter in the same order — and returns it as a :class:`ParamMask` without an index cache, so
    nothing beyond the shard outlives the backward that used it.

    Args:
        shard: this rank's uint32 shard (rows ``[r·c, (r+1)·c)`` of the full tensor, ``c = ceil(dim0 / world)``;
            trailing ranks may hold none).
        shape: the full parameter's shape.
        present: the group ids with an element anywhere in the full mask (all ranks agree on it).
        group: the data-parallel process group the parameter is sharded over.
    """

    __slots__ = ("packed", "shape", "present", "group", "peak", "uses", "prefetched", "_pending")

    def __init__(self, shard: torch.Tensor, shape: torch.Size, present: frozenset[int], group) -> None:
        self.packed = shard
        self.shape = torch.Size(shape)
        self.present = present
        self.group = group
        self.peak = 0  # bytes of the largest full mask this rank gathered
        self.uses = self.prefetched = 0  # full() calls, and those a prefetched gather served
        self._pending = None  # (work, buffer) of a gather started ahead of its use (:meth:`prefetch`)

    def _gather(self, async_op: bool):
        import torch.distributed as dist

        world = dist.get_world_size(self.group)
        rows = -(-self.shape[0] // world) if len(self.shape) else 1
        local = self.packed.view(torch.int32)  # gloo and NCCL have no uint32 collectives
        if local.shape[0] < rows:
            local = torch.cat([local, local.new_zeros((rows - local.shape[0], *self.shape[1:]))])
        out = local.new_empty((world * rows, *self.shape[1:]))
        work = dist.all_gather_into_tensor(out, local.contiguous(), group=self.group, async_op=async_op)
        self.peak = max(self.peak, out.numel() * out.element_size())
        return work, out

    def prefetch(self) -> None:
        """Start the all-gather of :meth:`full` now, without waiting for it (a collective, as :meth:`full`)."""
        if self._pending is None:
            self._pending = self._gather(async_op=True)

    def discard(self) -> None:
        """Finish and drop a prefetched gather that no backward used."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None

    def full(self) -> ParamMask:
        """Collective: the whole packed mask (a prefetched gather, else one now), without an index cache."""
        self.uses += 1
        if self._pending is not None:
            (work, out), self._pending = self._pending, None
            work.wait()
            self.prefetched += 1
        else:
            _, out = self._gather(async_op=False)
        packed = out[: self.shape[0]].view(torch.uint32)
        return ParamMask(packed, index_cache=False, present=self.present)


class _Prefetch:
    """The order in which a step's forward used its sharded masks' routes, so that each backward can start the
    gather of the mask the backward needs next (the route used just before it in the forward) while it computes.

    Every rank runs the same forward and backward order, so the collectives are issued in the same order on every
    rank. A prefetched gather that no backward consumes is finished at the next step (:meth:`MaskedGradients.batch`).
    """

    __slots__ = ("order", "where")

    def __init__(self) -> None:
        self.order: list[_Route] = []
        self.where: dict[int, int] = {}  # id(route) -> its last use in the forward

    def used(self, route: _Route) -> None:
        if route.active and isinstance(route.mask, ShardedParamMask):
            self.where[id(route)] = len(self.order)
            self.order.append(route)

    def before(self, route: _Route) -> None:
        """``route``'s backward starts: prefetch the mask of the active route used before it in the forward."""
        i = self.where.get(id(route))
        if i is not None and i > 0:
            self.order[i - 1].mask.prefetch()


class _Route:
    """What a patched module's backward needs: the batch's sample groups and one parameter's mask.

    ``active``: some group present in this step's batch on some rank has elements in the mask, so the backward
    needs the mask (under FSDP2 it gathers it then, on every rank alike).
    """

    __slots__ = ("groups", "mask", "active", "prefetch")

    def __init__(
        self,
        groups: SampleGroups,
        mask: ParamMask | ShardedParamMask,
        active: bool = True,
        prefetch: _Prefetch | None = None,
    ) -> None:
        self.groups = groups
        self.mask = mask
        self.active = active
        self.prefetch = prefetch

    def combine(self, part) -> torch.Tensor | None:
        """``part(samples)`` -> gradient summed over ``samples``; returns G_neutral + Σ_g m^g ⊙ G_g."""
        if self.active and self.prefetch is not None:
            self.prefetch.before(self)  # the next backward's mask gathers while this one computes
        grad = part(self.groups.neutral) if self.groups.neutral is not None else None
        if not self.active:
            return grad
        mask = self.mask.full()
        for g, samples in self.groups.groups:
            if g not in mask.present:
                continue  # m^g is zero on this parameter: group g contributes nothing
            contribution = part(samples)
            if grad is None:
                grad = torch.zeros_like(contribution)
            mask.add_masked(grad, contribution, g)
        return grad


def _used(*routes: _Route | None) -> None:
    """The forward used ``routes`` (``None`` skipped): record them for their step's prefetch, if it has one."""
    for route in routes:
        if route is not None and route.prefetch is not None:
            route.prefetch.used(route)


def _zeros_if_none(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if grad is None else grad


class _MaskedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, weight_route, bias_route):
        ctx.save_for_backward(x, weight)
        ctx.routes = (weight_route, bias_route)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        weight_route, bias_route = ctx.routes
        grad_x = grad_w = grad_b = None
        # Under autocast (bf16-mixed) the forward's F.linear ran in a lower precision, so grad_out has that dtype
        # while the saved x and weight keep theirs. The matmuls run in grad_out's dtype, as autocast's own linear
        # backward does; each group's sum is cast to the parameter's dtype before it is masked and accumulated.
        compute = grad_out.dtype
        if ctx.needs_input_grad[0]:
            grad_x = grad_out.matmul(weight.to(compute))
        b = weight_route.groups.batch_size
        d_out, d_in = weight.shape
        go = grad_out.reshape(b, -1, d_out)
        if ctx.needs_input_grad[1]:
            xs = x.reshape(b, -1, d_in).to(compute)

            def part(samples):
                # contiguous runs of samples are views: no copy, one matmul (or addmm) per run
                out = None
                for start, stop in samples.runs:
                    g_rows = go[start:stop].reshape(-1, d_out).t()
                    x_rows = xs[start:stop].reshape(-1, d_in)
                    out = g_rows.matmul(x_rows) if out is None else out.addmm_(g_rows, x_rows)
                return out.to(weight.dtype)

            grad_w = _zeros_if_none(weight_route.combine(part), weight)
        if ctx.needs_input_grad[2]:
            grad_b = _zeros_if_none(
                bias_route.combine(lambda smp: go.index_select(0, smp.idx).sum((0, 1), dtype=weight.dtype)),
                weight[:, 0],
            )
        return grad_x, grad_w, grad_b, None, None


class _MaskedEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, padding_idx, route):
        ctx.save_for_backward(ids)
        ctx.num_weights = weight.shape[0]
        ctx.padding_idx = -1 if padding_idx is None else padding_idx
        ctx.route = route
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_out):
        (ids,) = ctx.saved_tensors
        route = ctx.route
        b = route.groups.batch_size
        go = grad_out.reshape(b, -1, grad_out.shape[-1])
        ids2 = ids.reshape(b, -1)

        def part(samples):
            idx = samples.idx
            return torch.ops.aten.embedding_dense_backward(
                go.index_select(0, idx), ids2.index_select(0, idx), ctx.num_weights, ctx.padding_idx, False
            )

        grad = route.combine(part)
        if grad is None:
            grad = grad_out.new_zeros((ctx.num_weights, grad_out.shape[-1]))
        return None, grad, None, None


class _PerSampleScale(torch.autograd.Function):
    """``weight`` (shape S) as a ``(B, 1, …, S)`` expanded view; backward reduces the per-sample grads by group."""

    @staticmethod
    def forward(ctx, weight, shape, route):
        ctx.route = route
        return weight.expand(shape)

    @staticmethod
    def backward(ctx, grad):
        route = ctx.route
        shape = route.mask.shape
        per_sample = grad.reshape(route.groups.batch_size, *shape)
        out = route.combine(lambda samples: per_sample.index_select(0, samples.idx).sum(0))
        return (grad.new_zeros(shape) if out is None else out), None, None


def _is_scale_norm(module: nn.Module) -> bool:
    # RMSNorm-style modules compute ``self.weight * normalized(x)``: the weight broadcasts over leading dims.
    params = dict(module.named_parameters(recurse=False))
    return "rmsnorm" in type(module).__name__.lower() and set(params) == {"weight"} and params["weight"].dim() == 1


class MaskedGradients:
    """Exact per-sample masked gradients in one forward+backward for a model's trainable parameters.

    Build once per (model, masks); use :meth:`batch` around each step's forward (backward may run after it).
    Under FSDP2 (the trainable parameters are DTensors) build it on every rank at the same point, with this rank's
    mask shards; construction and :meth:`batch` are then collectives.

    Args:
        model: the module whose trainable parameters get masked gradients (e.g. the LightningModule).
        packed_masks: ``{canonical name: uint32 tensor of the parameter's shape}``; under FSDP2 each value is this
            rank's dim-0 shard (:func:`lightning_unlearn.masks.shard_masks`), of the local shard's shape.
        index_cache: keep each group's masked element indices (int32; see :class:`ParamMask` for the memory
            cost, :attr:`cache_bytes` for the total). Without it masks are decoded on every backward, which on the
            CPU costs a few full-size elementwise passes per parameter and group. Never used under FSDP2, where
            a rank keeps its mask shard only.

    Attributes:
        unsupported: names of trainable parameters owned by modules this engine cannot split per sample (all of
            them under activation checkpointing, whose recomputed forwards run outside :meth:`batch`); when
            non-empty, :attr:`one_pass` is False and callers use :func:`lockstep_masked_backward` instead.
        sharded: the parameters are FSDP2 DTensors and the masks this rank's shards.
        prefetch: under FSDP2, each backward starts the gather of the mask the next backward needs (default);
            False gathers each mask when its backward needs it (what ``benchmarks/masked_step.py`` compares with).
    """

    def __init__(self, model: nn.Module, packed_masks: Mapping[str, torch.Tensor], index_cache: bool = True) -> None:
        self.model = model
        self.packed_masks = packed_masks
        self.prefetch = True
        keys = resolve_param_masks(model, packed_masks)
        self.sharded = any(_is_dtensor(p) for p in keys)
        self._group = _shard_group(keys) if self.sharded else None
        self._mask: dict[nn.Parameter, ParamMask | ShardedParamMask] = {}
        shards = {}
        for p, k in keys.items():
            local = p.to_local() if _is_dtensor(p) else p
            mask = packed_masks[k].to(local.device)
            if tuple(mask.shape) != tuple(local.shape):
                where = "this rank's shard of the parameter" if self.sharded else "the parameter"
                raise ConfigError(
                    f"mask {k!r} has shape {tuple(mask.shape)} but {where} has {tuple(local.shape)}; "
                    "the masks were made for another model."
                )
            if self.sharded:
                shards[p] = mask
            else:
                self._mask[p] = ParamMask(mask, index_cache)
        if self.sharded:
            for p, present in zip(shards, _groups_on_any_rank(list(shards.values()), self._group)):
                self._mask[p] = ShardedParamMask(shards[p], p.shape, present, self._group)
        handled: set[nn.Parameter] = set()
        # (kind, module, names of its trainable parameters): the parameter objects are looked up at forward time,
        # because FSDP2 swaps a module's registered parameters between the sharded and the unsharded ones.
        self._modules: list[tuple[str, nn.Module, dict[str, ParamMask | ShardedParamMask]]] = []
        for mod in model.modules():
            own = {n: p for n, p in mod.named_parameters(recurse=False) if p.requires_grad}
            if not own:
                continue
            kind = None
            if isinstance(mod, nn.Linear) and type(mod).forward is nn.Linear.forward:
                kind = "linear"
            elif (
                isinstance(mod, nn.Embedding)
                and type(mod).forward is nn.Embedding.forward
                and mod.max_norm is None
                and not mod.scale_grad_by_freq
                and not mod.sparse
            ):
                kind = "embedding"
            elif _is_scale_norm(mod):
                kind = "scale"
            if kind is not None:
                self._modules.append((kind, mod, {n: self._mask[p] for n, p in own.items()}))
                handled.update(own.values())
        self.unsupported = sorted(
            canonical_name(n) for n, p in model.named_parameters() if p in keys and p not in handled
        )
        # Activation checkpointing re-runs forwards during backward, outside :meth:`batch`, with plain autograd.
        if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
            self.unsupported = sorted(canonical_name(n) for n, p in model.named_parameters() if p in keys)

    @property
    def one_pass(self) -> bool:
        """Whether every masked parameter has a one-pass rule (no lockstep needed)."""
        return not self.unsupported

    @property
    def cache_bytes(self) -> int:
        """Bytes of the index cache (0 without it); the packed masks themselves are 4 bytes per element."""
        return sum(getattr(m, "cache_bytes", 0) for m in self._mask.values())

    @property
    def mask_bytes(self) -> int:
        """Bytes of the packed masks this rank holds (under FSDP2: its shards, 4 bytes per local element)."""
        return sum(m.packed.numel() * m.packed.element_size() for m in self._mask.values())

    @property
    def peak_gathered_bytes(self) -> int:
        """Under FSDP2, the largest full mask this rank all-gathered in a backward so far (0 otherwise)."""
        return max((getattr(m, "peak", 0) for m in self._mask.values()), default=0)

    @property
    def prefetched_gathers(self) -> tuple[int, int]:
        """Under FSDP2, ``(gathers a backward found already started, gathers a backward used)`` so far."""
        masks = [m for m in self._mask.values() if isinstance(m, ShardedParamMask)]
        return sum(m.prefetched for m in masks), sum(m.uses for m in masks)

    def param_masks(self) -> dict[nn.Parameter, torch.Tensor]:
        """``{parameter: its packed uint32 mask}`` (under FSDP2: the local shard) for every trainable parameter."""
        return {p: m.packed for p, m in self._mask.items()}

    @contextlib.contextmanager
    def batch(self, group_ids: torch.Tensor | None) -> Iterator[None]:
        """Inside this context, forwards of the model record per-sample masked backward rules for ``group_ids``.

        A ``None`` or all-neutral ``group_ids`` is a no-op (plain autograd); under FSDP2, all-neutral on every rank.
        """
        if group_ids is None:
            yield
            return
        groups = SampleGroups.from_group_ids(group_ids)
        if self.sharded:
            present = frozenset(groups_present(group_ids, self._group)) - {NEUTRAL_GROUP}
        else:
            present = frozenset(g for g, _ in groups.groups)
        if not present:
            yield
            return
        if not self.one_pass:
            raise RuntimeError(
                f"parameters {self.unsupported[:3]} belong to modules without a one-pass masked-gradient rule; "
                "use lockstep_masked_backward for this model."
            )
        patched = []
        prefetch = None
        if self.sharded:
            for m in self._mask.values():
                m.discard()  # a gather the previous step started and its backward did not use
            prefetch = _Prefetch() if self.prefetch else None
        try:
            for kind, mod, masks in self._modules:
                routes = {n: _Route(groups, m, bool(m.present & present), prefetch) for n, m in masks.items()}
                mod.forward = self._patched_forward(kind, mod, groups, routes)
                patched.append(mod)
            yield
        finally:
            for mod in patched:
                del mod.forward

    def _patched_forward(self, kind: str, mod: nn.Module, groups: SampleGroups, routes: dict[str, _Route]):
        if kind == "linear":
            w_route = routes.get("weight")
            b_route = routes.get("bias")

            def linear(x):
                if w_route is None and b_route is None:
                    return F.linear(x, mod.weight, mod.bias)
                _check_sample_major(x, groups, mod)
                _used(b_route, w_route)  # the backward combines the weight's gradient first, then the bias's
                return _MaskedLinear.apply(x, mod.weight, mod.bias, w_route or b_route, b_route)

            return linear
        if kind == "embedding":
            route = routes["weight"]

            def embedding(ids):
                _check_sample_major(ids, groups, mod)
                _used(route)
                return _MaskedEmbedding.apply(ids, mod.weight, mod.padding_idx, route)

            return embedding
        route = routes["weight"]
        original = type(mod).forward

        def scale(x, *args, **kwargs):
            _used(route)
            weight = mod._parameters.pop("weight")
            try:
                shape = (groups.batch_size,) + (1,) * (x.dim() - 1 - weight.dim()) + tuple(weight.shape)
                _check_sample_major(x, groups, mod)
                mod.weight = _PerSampleScale.apply(weight, shape, route)
                return original(mod, x, *args, **kwargs)
            finally:
                del mod.weight
                mod._parameters["weight"] = weight

        return scale


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def _shard_group(params: Iterable[nn.Parameter]):
    """The process group the FSDP2 parameters are sharded over (one 1-D mesh, ``Shard(0)``), else ``ValueError``."""
    from torch.distributed.tensor import Shard

    meshes = set()
    for p in params:
        if not _is_dtensor(p):
            raise ConfigError("some trainable parameters are FSDP2-sharded and some are not; shard all of them.")
        if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
            raise ConfigError(
                f"one-pass masking under FSDP2 needs parameters sharded on dim 0 over a 1-D mesh, got "
                f"{p.placements} on a {p.device_mesh.ndim}-D mesh; use masking='lockstep'."
            )
        meshes.add(p.device_mesh)
    if len(meshes) != 1:
        raise ConfigError("the trainable parameters are sharded over different meshes; use masking='lockstep'.")
    return meshes.pop().get_group(0)


def _groups_on_any_rank(shards: list[torch.Tensor], group) -> list[frozenset[int]]:
    """For each parameter, the groups with an element in any rank's shard of its mask (one all-reduce)."""
    import torch.distributed as dist

    device = shards[0].device if shards else torch.device("cpu")
    flags = torch.zeros((len(shards), MAX_GROUPS), dtype=torch.int32, device=device)
    for i, shard in enumerate(shards):
        if shard.numel():
            flags[i, sorted(groups_in_mask(shard))] = 1
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return [frozenset(torch.nonzero(row).reshape(-1).tolist()) for row in flags.cpu()]


def _check_sample_major(x: torch.Tensor, groups: SampleGroups, mod: nn.Module) -> None:
    if x.dim() == 0 or x.shape[0] % groups.batch_size:
        raise RuntimeError(
            f"{type(mod).__name__} got an input of shape {tuple(x.shape)}, whose leading dimension is not the batch "
            f"size {groups.batch_size} (or a multiple of it); per-sample masking needs sample-major activations."
        )


@contextlib.contextmanager
def masked_gradients(
    model: nn.Module, packed_masks: Mapping[str, torch.Tensor] | None, group_ids: torch.Tensor | None
) -> Iterator[None]:
    """Convenience: ``with masked_gradients(model, masks, batch["group_ids"]): loss = step(); loss.backward()``.

    No-op when ``packed_masks`` or ``group_ids`` is ``None``. Builds a :class:`MaskedGradients` each call; keep one
    engine per model in loops.
    """
    if packed_masks is None or group_ids is None:
        yield
        return
    with MaskedGradients(model, packed_masks).batch(group_ids):
        yield
