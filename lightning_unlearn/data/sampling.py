"""Batch orders that are a pure function of (seed, epoch), and loaders that resume mid-epoch.

:class:`EpochSeededSampler` is the one sampler of every training loader in the package. :class:`ResumableLoader`
is a ``DataLoader`` over it that implements Lightning's stateful-loader protocol (``state_dict`` /
``load_state_dict``): a checkpoint records how many batches of the current epoch were consumed, and a resumed run
replays exactly the rest of that epoch instead of starting it again. The count comes from the trainer's own batch
progress (``position``), not from the loader's iterator, which Lightning's fetcher runs one batch ahead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from lightning_unlearn.errors import ConfigError


class EpochSeededSampler(DistributedSampler):
    """A permutation of ``range(n)`` that depends only on ``(seed, epoch)``, split over data-parallel ranks.

    Rank ``r`` of ``W`` takes every ``W``-th index of the permutation (padded by repeating its head, like
    ``DistributedSampler``). With a per-rank batch of ``b`` the ranks' ``k``-th batches together are the
    permutation's ``k``-th slice of ``b·W`` indices: a run on ``W`` processes sees the batches one process with
    batch ``b·W`` sees (up to the epoch's last, partial batch). Being a ``DistributedSampler``, Lightning uses it
    as it is instead of wrapping it in a sampler that reshuffles. ``num_replicas``/``rank`` default to the
    initialized process group (1 and 0 without one).

    With ``lengths`` and ``group_batches = k > 0`` the permutation is grouped by length, as Hugging Face's
    ``group_by_length``: each run of ``k`` global batches (``batch_size · W`` samples) is sorted by length and cut
    into global batches, and the global batches are shuffled. A batch then pads to lengths close to its own
    (padding costs compute on every token), and ranks still take their shares of the same global batch.

    With ``batch_keys`` (one key per sample, e.g. a Lacuna group id) every global batch holds samples of one key:
    each key's samples, in permutation order (grouped by length within the key when asked), are cut into global
    batches, a key's last batch filled up with its own first samples, and the batches of every key are shuffled
    together. An epoch is then ``Σ_key ⌈count/(batch_size·W)⌉`` global batches.
    """

    def __init__(
        self,
        n: int,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        lengths: Sequence[int] | None = None,
        batch_size: int = 1,
        group_batches: int = 0,
        batch_keys: Sequence[int] | None = None,
    ) -> None:
        # DistributedSampler.__init__ wants a dataset and a process group; only the length and the layout matter.
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.num_replicas = num_replicas if num_replicas is not None else (
            torch.distributed.get_world_size() if distributed else 1)  # fmt: skip
        self.rank = rank if rank is not None else (torch.distributed.get_rank() if distributed else 0)
        if not 0 <= self.rank < self.num_replicas:
            raise ConfigError(f"rank {self.rank} is not in [0, {self.num_replicas}).")
        if group_batches and (lengths is None or len(lengths) != n):
            raise ConfigError("grouping batches by length (group_batches > 0) needs the length of each sample.")
        self.n, self.seed, self.shuffle, self.epoch, self.drop_last = n, seed, shuffle, 0, False
        if batch_keys is not None and len(batch_keys) != n:
            raise ConfigError(f"batch_keys has {len(batch_keys)} keys for {n} samples; give one key per sample.")
        self.lengths, self.batch_size, self.group_batches = lengths, batch_size, group_batches
        self.batch_keys = list(batch_keys) if batch_keys is not None else None
        self.num_samples = -(-n // self.num_replicas)
        if self.batch_keys is not None:
            size = batch_size * self.num_replicas
            counts = {k: self.batch_keys.count(k) for k in set(self.batch_keys)}
            self.num_samples = sum(-(-c // size) for c in counts.values()) * batch_size
            self.total_size = self.num_samples * self.num_replicas
        self.total_size = self.num_samples * self.num_replicas
        self._resume: tuple[int, int] | None = None  # (epoch, indices of it already consumed on this rank)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation from the next pass on (Lightning calls it at every epoch start).

        Args:
            epoch: the epoch, 0-based.
        """
        self.epoch = epoch

    def resume(self, epoch: int, consumed: int) -> None:
        """The next pass over ``epoch`` starts after its first ``consumed`` indices on this rank (a mid-epoch
        resume); a pass over another epoch, or any later pass, starts at the beginning."""
        self._resume = (epoch, consumed) if consumed > 0 else None

    def __iter__(self):
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.n, generator=gen).tolist()
            if self.batch_keys is not None:
                order = self._one_key_per_batch(order, gen)
            elif self.group_batches:
                order = self._group_by_length(order, gen)
        else:
            order = list(range(self.n))
        if order:
            order += (order * (self.total_size // len(order) + 1))[: self.total_size - len(order)]
        mine = order[self.rank : self.total_size : self.num_replicas]
        if self._resume is not None:
            epoch, consumed = self._resume
            self._resume = None
            if epoch == self.epoch:
                mine = mine[consumed:]
        return iter(mine)

    def __len__(self) -> int:
        return self.num_samples

    def _one_key_per_batch(self, order: list[int], gen: torch.Generator) -> list[int]:
        size = self.batch_size * self.num_replicas
        batches = []
        for key in sorted(set(self.batch_keys)):
            mine = [i for i in order if self.batch_keys[i] == key]
            if self.group_batches:
                run = size * self.group_batches
                mine = [
                    i for s in range(0, len(mine), run) for i in sorted(mine[s : s + run], key=self.lengths.__getitem__)
                ]
            fill = -len(mine) % size  # fill the key's last batch with its own samples
            mine += (mine * (fill // len(mine) + 1))[:fill]
            batches += [mine[k : k + size] for k in range(0, len(mine), size)]
        return [i for b in torch.randperm(len(batches), generator=gen).tolist() for i in batches[b]]

    def _group_by_length(self, order: list[int], gen: torch.Generator) -> list[int]:
        size = self.batch_size * self.num_replicas
        run = size * self.group_batches
        batches = []
        for start in range(0, len(order), run):
            chunk = sorted(order[start : start + run], key=lambda i: self.lengths[i])
            batches += [chunk[k : k + size] for k in range(0, len(chunk), size)]
        # the epoch's last, partial batch stays last (it would otherwise end up short in the middle of the epoch)
        full = [b for b in batches if len(b) == size]
        rest = [i for b in batches if len(b) < size for i in b]
        return [i for b in torch.randperm(len(full), generator=gen).tolist() for i in full[b]] + rest


class ResumableLoader(DataLoader):
    """A ``DataLoader`` over an :class:`EpochSeededSampler` whose position in the epoch survives a checkpoint.

    Args:
        *args, **kwargs: as ``DataLoader``; ``sampler`` must be an :class:`EpochSeededSampler`. Without a
            ``generator`` one seeded from the sampler is used, so creating an iterator never draws from the global
            RNG that dropout uses (a resumed run would otherwise draw differently).
        position: returns the number of batches of the current epoch already trained on (see
            :func:`trainer_position`); ``None`` records 0 (the loader then resumes at the start of the epoch).
    """

    def __init__(self, *args, position: Callable[[], int] | None = None, **kwargs) -> None:
        sampler = kwargs.get("sampler")
        if not isinstance(sampler, EpochSeededSampler):
            raise TypeError(f"ResumableLoader needs an EpochSeededSampler, got {type(sampler).__name__}.")
        if kwargs.get("generator") is None:
            kwargs["generator"] = torch.Generator().manual_seed(sampler.seed)
        super().__init__(*args, **kwargs)
        self.position = position

    def state_dict(self) -> dict:
        """``{"epoch", "batches"}``: the sampler's epoch and the batches of it already trained on."""
        return {"epoch": int(self.sampler.epoch), "batches": int(self.position()) if self.position else 0}

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume after the batches of the saved epoch already consumed (modulo the loader's length, when it cycles).

        Args:
            state_dict: what :meth:`state_dict` returned.
        """
        # A loader shorter than the epoch (a cycled retain set) is somewhere in its k-th pass.
        batches = int(state_dict.get("batches", 0)) % max(len(self), 1)
        self.sampler.resume(int(state_dict.get("epoch", 0)), batches * self.batch_size)


def trainer_position(datamodule) -> Callable[[], int]:
    """``position`` for a :class:`ResumableLoader` of ``datamodule``: the batches of the current epoch the fit loop
    has processed (read when a checkpoint is saved; 0 outside a Trainer)."""

    def position() -> int:
        trainer = getattr(datamodule, "trainer", None)
        if trainer is None:
            return 0
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)

    return position
