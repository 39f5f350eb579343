"""Shared pieces of the masked-strategy tests: a tiny per-sample-mean LM module, batches, and the reference loop.

Imported by the tests and by the worker script that the multi-process tests launch.
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn.losses import nll_loss, sequence_logprobs
from lightning_unlearn.strategies import microbatch_masked_gradients

GROUP_IDS = [-1, 0, 1, 2, 3, 4, 5, -1]  # all 7 group ids; 2 ranks get [-1,0,1,2] and [3,4,5,-1]
NUM_GROUPS = 6


def make_batches(vocab: int, steps: int = 3, batch: int = 8, seq: int = 12, seed: int = 0) -> list[dict]:
    """``steps`` LM batches with padding, a 2-token prompt, and ``group_ids`` covering -1..5."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(4, vocab, (batch, seq), generator=gen)
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
        attn = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        ids = ids.masked_fill(attn == 0, 2)
        labels = ids.masked_fill(attn == 0, -100)
        labels[:, :2] = -100
        out.append({"input_ids": ids, "attention_mask": attn, "labels": labels, "group_ids": torch.tensor(GROUP_IDS)})
    return out


def per_sample_mean_loss(model, batch) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps, lengths = sequence_logprobs(logits, batch["labels"])
    return nll_loss(logps, lengths)


class RankSlices(Dataset):
    """Rank ``r`` of ``w`` sees samples ``[r·B/w, (r+1)·B/w)`` of every global batch, in order (no shuffling)."""

    def __init__(self, batches: list[dict], rank: int, world: int) -> None:
        self.items = []
        for b in batches:
            n = b["input_ids"].shape[0] // world
            for k in range(rank * n, (rank + 1) * n):
                self.items.append({key: v[k] for key, v in b.items()})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


class MaskedLM(LightningModule):
    """The strategy contract in its smallest form: ``packed_masks``, ``restrict_update_groups``, mean loss.

    Args:
        model_dir: a local directory with a saved causal LM.
        batches: the global batches to train on (each rank takes its slice).
        packed_masks: full packed masks, or ``None`` for plain training.
        optimizer: ``"sgd"`` or ``"adamw"``.
        lr: learning rate.
        restrict_update_groups: groups whose union limits every update, or ``None``.
    """

    def __init__(
        self,
        model_dir: str,
        batches: list[dict],
        packed_masks: dict | None,
        optimizer: str = "sgd",
        lr: float = 0.5,
        restrict_update_groups: list[int] | None = None,
    ) -> None:
        super().__init__()
        from lightning_unlearn.models import load_causal_lm

        self.model = load_causal_lm(model_dir)
        self.batches = batches
        self.packed_masks = packed_masks
        self.optimizer_name = optimizer
        self.lr = lr
        self.restrict_update_groups = restrict_update_groups

    def training_step(self, batch, batch_idx):
        return per_sample_mean_loss(self.model, batch)

    def configure_optimizers(self):
        if self.optimizer_name == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.1)
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        world = self.trainer.world_size
        per_rank = self.batches[0]["input_ids"].shape[0] // world
        return DataLoader(RankSlices(self.batches, self.trainer.global_rank, world), batch_size=per_rank)


def reference_training(
    model, batches: list[dict], packed_masks: dict | None, lr: float = 0.5
) -> dict[str, torch.Tensor]:
    """Paper Algorithm 1 with plain SGD: per-sample backward, mask, sum, mean; returns the final state dict."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for b in batches:
        microbatch_masked_gradients(model, packed_masks, b, b["group_ids"], per_sample_mean_loss)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def relative_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max |a − b| / max |b| over all shared tensors."""
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in b)
    scale = max(float(b[k].float().abs().max()) for k in b)
    return diff / scale
