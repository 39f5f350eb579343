"""Per-parameter group masks packed as the bits of one uint32 per parameter element (Lacuna Section 3.3, App. C).

Bit ``g`` of ``packed[name][i]`` is set iff element ``i`` of parameter ``name`` belongs to group ``g``.
Group ids are 0-based bit indices: the paper's G_1..G_6 are ids 0..5, forget groups G_1-G_3 are ids 0-2.
Groups are disjoint, so every element has at most one bit set. Elements outside θ_mask (input embeddings,
normalization layers, the last two transformer blocks) have no bit set: group samples never update them.

torch (2.13) has no ``>>``, ``<<`` or ``~`` for uint32 on the CPU; decode with ``(packed & bits) != 0``.
This module imports torch and safetensors only.
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from lightning_unlearn.atomic import write_file_atomically
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.parameter_names import canonical_name

MAX_GROUPS = 32
NEUTRAL_GROUP = -1
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")


def group_bits(groups: int | Iterable[int]) -> int:
    """The integer whose set bits are ``groups`` (validated to lie in 0..31)."""
    ids = [groups] if isinstance(groups, int) else list(groups)
    if not ids:
        raise ConfigError("no group ids given; pass at least one id in 0..31.")
    bits = 0
    for g in ids:
        if not isinstance(g, int) or not 0 <= g < MAX_GROUPS:
            raise ConfigError(f"group id {g!r} is out of range; ids are 0-based bit indices in 0..{MAX_GROUPS - 1}.")
        bits |= 1 << g
    return bits


def group_mask(packed: torch.Tensor, groups: int | Iterable[int]) -> torch.Tensor:
    """Bool tensor of ``packed``'s shape: True where an element belongs to any of ``groups``.

    Args:
        packed: one parameter's uint32 mask tensor.
        groups: one group id or several (their union).
    """
    if packed.dtype != torch.uint32:
        raise TypeError(f"packed masks must be uint32, got {packed.dtype}.")
    bits = group_bits(groups)
    # Bit 31 does not fit in a signed int32 scalar; materialise the operand as uint32 explicitly.
    return (packed & torch.tensor(bits, dtype=torch.uint32, device=packed.device)) != 0


class LazyMasks(Mapping):
    """Packed masks made one tensor at a time, on access, and never cached.

    A consumer that keeps only part of each tensor (FSDP's dim-0 shard, a digest, per-group counts) then never holds
    the full masks: peak memory is one parameter's mask, not the model's. Each access recomputes (sampling) or
    re-reads (a file), so a consumer that needs every tensor more than once should take ``dict(lazy)`` once.

    Args:
        shapes: ``{canonical name: shape}``, in the masks' order.
        make: returns the mask of a name: uint32 packed groups, or bool for ``union_mask(..., lazy=True)``.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], make: Callable[[str], torch.Tensor]) -> None:
        self.shapes = {n: tuple(s) for n, s in shapes.items()}
        self._make = make

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(name)
        return self._make(name)

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def mask_shape(packed: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    """The shape of ``packed[name]``, without materialising it when ``packed`` is a :class:`LazyMasks` (or any
    mapping that knows its ``shapes``, as ``models.LazyWeights`` does)."""
    shapes = getattr(packed, "shapes", None)
    return tuple(shapes[name]) if isinstance(shapes, Mapping) else tuple(packed[name].shape)


def default_exclusions(model: nn.Module) -> list[str]:
    """Names of parameters outside θ_mask: input embeddings, normalization layers, the last two blocks."""
    excluded: set[str] = set()
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    emb_ids = {id(p) for p in emb.parameters()} if emb is not None else set()
    norm_ids = {
        id(p)
        for m in model.modules()
        if "norm" in type(m).__name__.lower() or isinstance(m, nn.LayerNorm)
        for p in m.parameters(recurse=False)
    }
    blocks = {int(m.group(1)) for n, _ in model.named_parameters(remove_duplicate=False) if (m := _BLOCK.search(n))}
    last_two = set(sorted(blocks)[-2:]) if blocks else set()
    for name, p in model.named_parameters(remove_duplicate=False):
        m = _BLOCK.search(name)
        if id(p) in emb_ids or id(p) in norm_ids or (m and int(m.group(1)) in last_two):
            excluded.add(canonical_name(name))
    return sorted(excluded)


def masked_parameter_names(model: nn.Module, exclude: Sequence[str] | None = None) -> list[str]:
    """Canonical names of the parameters in θ_mask.

    Args:
        model: the model whose parameters are masked.
        exclude: regexes (``re.search`` on canonical names) of parameters outside θ_mask; ``None`` uses the
            paper's default (:func:`default_exclusions`).
    """
    if exclude is None:
        skip = set(default_exclusions(model))
        keep = lambda n: n not in skip  # noqa: E731
    else:
        patterns = [re.compile(p) for p in exclude]
        keep = lambda n: not any(p.search(n) for p in patterns)  # noqa: E731
    names = []
    for name, _ in _unique_named_parameters(model):
        if keep(name):
            names.append(name)
    return names


def _unique_named_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Canonical-named parameters; a tied parameter is listed once under its first name."""
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters(remove_duplicate=False):
        cname = canonical_name(name)
        if any(part.startswith("lora_") for part in cname.split(".")):
            continue  # adapter weights are not part of the base model's θ
        if id(p) in seen:
            continue
        seen.add(id(p))
        out.append((cname, p))
    return out


def _param_seed(seed: int, name: str) -> int:
    # Seeding each tensor from (seed, name) makes a tensor's mask independent of iteration order and wrapping.
    return (zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF


def sample_masks(
    model: nn.Module,
    num_groups: int = 6,
    coverage: float = 0.05,
    seed: int = 0,
    exclude: Sequence[str] | None = None,
    lazy: bool = False,
) -> dict[str, torch.Tensor] | LazyMasks:
    """Sample disjoint, element-wise random group masks over θ_mask and pack them.

    Every element of θ_mask draws u ~ U[0, 1); it joins group ``g`` iff ``g·coverage <= u < (g+1)·coverage``.
    Each group therefore covers ``coverage`` of θ_mask in expectation, and no element joins two groups.

    Args:
        model: the model to mask (only names, shapes and structure are read).
        num_groups: G, at most 32.
        coverage: fraction of θ_mask each group covers; ``num_groups * coverage`` must be ≤ 1.
        seed: the masks are a deterministic function of ``seed`` and the parameter names.
        exclude: see :func:`masked_parameter_names`.
        lazy: return a :class:`LazyMasks` that samples each tensor when it is read (same values).

    Returns:
        ``{canonical parameter name: uint32 tensor of the parameter's shape}`` for every parameter;
        excluded parameters are all zero.
    """
    if not 1 <= num_groups <= MAX_GROUPS:
        raise ConfigError(f"num_groups={num_groups} must be in 1..{MAX_GROUPS} (one bit of a uint32 per group).")
    if not 0 < coverage <= 1 or num_groups * coverage > 1 + 1e-9:
        raise ConfigError(
            f"coverage={coverage} with num_groups={num_groups} does not fit: groups are disjoint, so "
            "num_groups * coverage must be at most 1."
        )
    included = set(masked_parameter_names(model, exclude))
    if not included:
        raise ConfigError("θ_mask is empty: every parameter is excluded. Loosen `exclude`.")
    shapes = {name: tuple(p.shape) for name, p in _unique_named_parameters(model)}

    def make(name: str) -> torch.Tensor:
        shape = shapes[name]
        if name not in included:
            return torch.zeros(shape, dtype=torch.uint32)
        gen = torch.Generator().manual_seed(_param_seed(seed, name))
        u = torch.rand(shape, generator=gen)
        slot = torch.floor(u / coverage).to(torch.int64)  # group id, or ≥ num_groups for "no group"
        in_group = slot < num_groups
        values = torch.where(in_group, torch.ones_like(slot) << slot.clamp(max=MAX_GROUPS - 1), 0)
        return values.to(torch.uint32)

    masks = LazyMasks(shapes, make)
    return masks if lazy else dict(masks)


def coverage_by_group(packed: Mapping[str, torch.Tensor], num_groups: int, names: Iterable[str] | None = None):
    """Fraction of the elements of ``names`` (default: all) that each group covers, as a list of floats."""
    names = list(packed) if names is None else list(names)
    total = sum(math.prod(mask_shape(packed, n)) for n in names)
    counts = [0] * num_groups
    for n in names:
        t = packed[n]  # read once (a LazyMasks recomputes on every access)
        for g in range(num_groups):
            counts[g] += int(group_mask(t, g).sum())
    return [c / max(total, 1) for c in counts]


def union_mask(
    packed: Mapping[str, torch.Tensor], groups: int | Iterable[int], lazy: bool = False
) -> dict[str, torch.Tensor] | LazyMasks:
    """``{name: bool tensor}`` of the union of ``groups`` (e.g. m^F for forget groups 0-2).

    ``lazy`` returns a :class:`LazyMasks` that decodes each tensor from ``packed`` when it is read (with lazy
    ``packed``, one mask tensor is then in memory at a time).
    """
    if lazy:
        ids = [groups] if isinstance(groups, int) else list(groups)
        group_bits(ids)  # validate the ids now, not at the first read
        return LazyMasks({n: mask_shape(packed, n) for n in packed}, lambda n: group_mask(packed[n], ids))
    return {n: group_mask(t, groups) for n, t in packed.items()}


def shard_masks(packed: Mapping[str, torch.Tensor], rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Each rank's dim-0 shard, split like FSDP2's ``Shard(0)`` (``torch.chunk``; trailing ranks may be empty)."""
    out = {}
    for n, t in packed.items():
        chunks = torch.chunk(t, world_size, dim=0) if t.dim() else (t,)
        if rank < len(chunks):
            out[n] = chunks[rank].clone()
        else:
            out[n] = t.new_zeros((0, *t.shape[1:]))
    return out


def validate_masks(packed: Mapping[str, torch.Tensor], model: nn.Module) -> None:
    """Raise ``ValueError`` naming the first parameter whose name or shape does not match ``model``."""
    params = dict(_unique_named_parameters(model))
    for name, p in params.items():
        if name not in packed:
            raise ConfigError(
                f"masks do not match the model: parameter {name!r} has no mask. The masks file was made for "
                "another model; sample masks for this model (sample_masks) or load the matching file."
            )
        if mask_shape(packed, name) != tuple(p.shape):
            raise ConfigError(
                f"masks do not match the model: {name!r} has shape {tuple(p.shape)} but its mask has shape "
                f"{mask_shape(packed, name)}. The masks file was made for another model."
            )
    extra = [n for n in packed if n not in params]
    if extra:
        raise ConfigError(
            f"masks do not match the model: mask {extra[0]!r} names no parameter of the model. "
            "The masks file was made for another model."
        )


def groups_in_mask(packed: torch.Tensor) -> frozenset[int]:
    """The group ids with at least one element in this packed tensor (from its few distinct values)."""
    values = torch.unique(packed.reshape(-1).view(torch.int32)).tolist()
    found = 0
    for v in values:
        found |= v & 0xFFFFFFFF
    return frozenset(g for g in range(MAX_GROUPS) if found >> g & 1)


def check_mask_groups(
    packed: Mapping[str, torch.Tensor],
    meta: Mapping[str, object],
    forget_groups: Iterable[int],
    retain_groups: Iterable[int],
    masks_path: str | os.PathLike = "masks",
    flags: tuple[str, str] = ("--forget_groups", "--retain_groups"),
) -> None:
    """Raise ``ValueError`` (one line) for forget / retain groups a localization AUC cannot use: no forget group, a
    group in both, or a group the masks do not hold (``num_groups`` of the metadata, as every injection export
    records it; else the groups with any element, every mask read once). An absent retain group would leave
    m^F ∨ m^R = m^F and AUC(F|R) = AUC(F) without a word; an absent forget group, an empty m^F.

    Args:
        packed: the packed masks (:func:`load_masks`, lazy or not).
        meta: their metadata.
        forget_groups, retain_groups: the groups of m^F and m^R.
        masks_path: the file named in the message.
        flags: how the caller spells the two options (the command's flags or a callback's arguments).
    """
    forget, retain = list(forget_groups), list(retain_groups)
    if not forget:
        raise ConfigError(f"{flags[0]} is empty; name the group(s) of the forget mask m^F, e.g. {flags[0]} [0].")
    if both := sorted(set(forget) & set(retain)):
        raise ConfigError(
            f"{flags[0]} {forget} and {flags[1]} {retain} share group(s) {both}; a group is forgotten or retained, "
            "not both."
        )
    held = meta.get("num_groups")
    if isinstance(held, int):
        present, shown = set(range(held)), f"groups 0–{held - 1} (num_groups {held})"
    else:
        present = set().union(*(groups_in_mask(packed[name]) for name in packed))
        shown = f"groups {sorted(present)}"
    for flag, groups in zip(flags, (forget, retain)):
        if absent := [g for g in groups if g not in present]:
            raise ConfigError(
                f"{flag} {groups}: the masks {str(masks_path)!r} hold {shown}, not {absent}; choose among them"
                + (" (or [] for no AUC(F|R))." if flag == flags[1] else ".")
            )


def check_masks_for_weights(
    packed: Mapping[str, torch.Tensor],
    meta: Mapping[str, object],
    weights: Mapping[str, torch.Tensor],
    pre_path: str | os.PathLike | None = None,
    masks_path: str | os.PathLike = "masks",
) -> None:
    """Raise ``ValueError`` (one line) when the masks do not belong to these weights: a mask names no tensor of
    ``weights`` or has another shape, or (masks written by an injection export, which records its θ_pre) the
    model at ``pre_path`` is not the θ_pre the masks were sampled on, even with the same shapes."""
    for name in packed:  # shapes only: lazy masks and weights (models.LazyWeights) are not read
        if name not in weights:
            raise ConfigError(f"masks {str(masks_path)!r} do not match the model: mask {name!r} names no tensor of it.")
        if mask_shape(packed, name) != mask_shape(weights, name):
            raise ConfigError(
                f"masks {str(masks_path)!r} do not match the model: {name!r} has shape {mask_shape(weights, name)} "
                f"but its mask has shape {mask_shape(packed, name)}."
            )
    recorded = meta.get("pre_fingerprint")
    if pre_path is not None and recorded is not None:
        from lightning_unlearn.models import weights_fingerprint

        if weights_fingerprint(pre_path) != recorded:
            raise ConfigError(
                f"masks {str(masks_path)!r} were sampled on another θ_pre than {str(pre_path)!r} (same names and "
                "shapes, other weights); pass the masks exported with that model, or the θ_pre they belong to."
            )


def save_masks(path: str | os.PathLike, packed: Mapping[str, torch.Tensor], **metadata) -> None:
    """Write ``packed`` to a safetensors file atomically (temp file, then rename).

    Metadata values are stored JSON-encoded (safetensors metadata is ``str -> str``).
    """
    from safetensors.torch import save_file

    for n, t in packed.items():
        if t.dtype != torch.uint32:
            raise TypeError(f"mask {n!r} is {t.dtype}; packed masks are uint32.")
    meta = {k: json.dumps(v) for k, v in metadata.items()}
    tensors = {n: t.contiguous() for n, t in packed.items()}
    write_file_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def load_masks(
    path: str | os.PathLike, model: nn.Module | None = None, lazy: bool = False
) -> tuple[dict[str, torch.Tensor] | LazyMasks, dict[str, object]]:
    """Read packed masks and their metadata; with ``model``, check every name and shape against it.

    ``lazy`` returns a :class:`LazyMasks` that reads each tensor from the file when it is accessed (the check reads
    only the header).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise MissingPathError(f"masks file {str(path)!r} does not exist.")
    try:
        handle = safe_open(str(path), framework="pt")
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error kinds for a foreign file
        raise ConfigError(
            f"masks file {str(path)!r} is not a safetensors file ({str(err).splitlines()[0][:80]}); give the "
            "masks.safetensors an injection exported (save_masks)."
        ) from None
    with handle as f:
        meta = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
        if lazy:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        else:
            packed = {k: f.get_tensor(k) for k in f.keys()}

    if lazy:

        def read(name: str) -> torch.Tensor:
            with safe_open(str(path), framework="pt") as f:
                return f.get_tensor(name)

        packed = LazyMasks(shapes, read)
    if model is not None:
        validate_masks(packed, model)
    return packed, meta
