"""The one home of rank, broadcast, gather and local-view helpers (every rank calls the collectives in the same
order): the callbacks, objectives and strategies use these, never their own copies."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from lightning_unlearn.masks import canonical_name

T = TypeVar("T")


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_gather_objects(obj: T) -> list[T]:
    """Every rank's ``obj`` in rank order, on every rank (pickled; meant for small results)."""
    rank, size = world()
    if size == 1:
        return [obj]
    out: list = [None] * size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s ``obj`` on every rank."""
    _, size = world()
    if size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def rank_batches(items: Sequence[T], batch_size: int, rank: int, world_size: int) -> list[list[tuple[int, T]]]:
    """This rank's batches of ``(global index, item)``: batch ``b`` goes to rank ``b % world_size``.

    Batches are formed before they are dealt out, so each batch holds the same items (and padding) as in one
    process — results agree across world sizes. Every rank gets the same number of batches (missing ones are
    empty lists): a sharded forward is a collective, so all ranks must step together.
    """
    batches = [list(enumerate(items))[s : s + batch_size] for s in range(0, len(items), batch_size)]
    per_rank = -(-len(batches) // world_size)
    mine = batches[rank::world_size]
    return mine + [[] for _ in range(per_rank - len(mine))]


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter is a DTensor (FSDP2 / tensor parallel): forwards are then collectives."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def full_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(canonical name, full CPU tensor)`` for every parameter; gathers DTensor shards (collective)."""
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        t = p.detach()
        if type(t).__name__ == "DTensor":
            t = t.full_tensor()
        yield canonical_name(name), t.cpu()


def local_view(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard — the object itself, so in-place ops write through — or a plain tensor unchanged."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's full state dict on CPU. Collective when FSDP2 sharded it (every rank must call it; rank 0 gets
    the full tensors, as ``get_model_state_dict`` with ``full_state_dict=True, cpu_offload=True`` gives them)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
