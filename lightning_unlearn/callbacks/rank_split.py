"""Rank-split batched evaluation: each rank runs its share of the batches, results are gathered on every rank."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from torch import nn
from tqdm.auto import tqdm

from lightning_unlearn.distributed import all_gather_objects, is_sharded, rank_batches, world
from lightning_unlearn.generation import Generation, generate_greedy

T = TypeVar("T")
R = TypeVar("R")


def map_batches(
    items: Sequence[T],
    batch_size: int,
    run: Callable[[list[T]], list[R]],
    model: nn.Module,
    progress: str | None = None,
    dummy: Callable[[list[T]], object] | None = None,
) -> list[R]:
    """``run`` over this rank's batches, gathered into one list in ``items`` order on every rank.

    With sharded parameters every forward is a collective, so a rank with fewer batches runs ``dummy`` (default
    ``run``) on a one-item batch, result dropped, to keep step with the others; a ``run`` that updates a
    ``torchmetrics.Metric`` passes a ``dummy`` that only runs the forward. ``progress``: the label of a progress
    bar on rank 0 (stderr), ``None`` for none.
    """
    if not items:
        return []
    rank, size = world()
    sharded = size > 1 and is_sharded(model)
    local: list[tuple[int, R]] = []
    batches = rank_batches(items, batch_size, rank, size)
    bar = None if progress is None or rank != 0 else tqdm(total=len(batches), desc=progress, unit="batch", leave=False)
    for batch in batches:
        if bar is not None:
            bar.update()
        if not batch:
            if sharded:
                (dummy or run)([items[0]])
            continue
        results = run([item for _, item in batch])
        local.extend((i, r) for (i, _), r in zip(batch, results))
    if bar is not None:
        bar.close()
    gathered = [pair for part in all_gather_objects(local) for pair in part]
    gathered.sort(key=lambda pair: pair[0])
    return [r for _, r in gathered]


def generate_all(
    model: nn.Module,
    tokenizer,
    prompts: Sequence[str],
    batch_size: int,
    max_new_tokens: int,
    progress: str | None = None,
) -> list[Generation]:
    """Greedy answers to every prompt (left-padded batches, KV cache), split over ranks and gathered."""
    synced = world()[1] > 1 and is_sharded(model)

    def run(batch: list[str]) -> list[Generation]:
        return generate_greedy(model, tokenizer, batch, max_new_tokens=max_new_tokens, synced_gpus=synced)

    return map_batches(list(prompts), batch_size, run, model, progress)
