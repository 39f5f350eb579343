"""Paired forget/retain batches for unlearning objectives.

Sources (``forget_path`` / ``retain_path``) are read by :func:`lightning_unlearn.data.records.read_records`: JSONL,
JSON, CSV or Parquet files, ``datasets`` folders, or a Lacuna testbed splits directory (a ``DatasetDict`` or a folder
of ``save_to_disk`` splits, from which ``forget_split`` / ``retain_split`` are taken; its ``group_id`` column becomes
the batch's ``group_ids``). ``prompt_key`` / ``answer_key`` name the columns (a TOFU ``question`` column is read as
the prompt), and ``chat_template`` renders each prompt as a user turn of the tokenizer's chat template, exactly as
the evaluation callbacks and LENS generation render it.

Training batches are ``{"forget": LM batch, "retain": LM batch}`` (plus ``"mismatch"``: forget prompts with random
retain answers, for GA-Retain). Forget and retain come from separate dataloaders combined by Lightning, so under
DDP/FSDP each gets its own ``DistributedSampler``: every rank sees a disjoint shard of the retain set (unlike
implementations that draw the same retain items on every rank). An epoch is one pass over the forget set.
"""

from __future__ import annotations

import logging
import random
from functools import partial
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from lightning_unlearn.data.collate import encode_pair_with_cuts, pad_batch
from lightning_unlearn.data.fingerprint import FingerprintedData
from lightning_unlearn.data.records import read_records
from lightning_unlearn.data.sampling import EpochSeededSampler, ResumableLoader, trainer_position
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import MAX_GROUPS, NEUTRAL_GROUP
from lightning_unlearn.models import load_tokenizer

MIN_PAIR_LENGTH = 4  # BOS, one prompt token, one answer token, EOS
log = logging.getLogger("lightning_unlearn")


def check_max_length(max_length: int, name: str = "max_length") -> None:
    """Refuse a ``max_length`` below :data:`MIN_PAIR_LENGTH`: no pair would fit."""
    if max_length < MIN_PAIR_LENGTH:
        raise ConfigError(
            f"{name}={max_length} leaves no room for a pair: it needs at least {MIN_PAIR_LENGTH} tokens (BOS, one "
            "prompt token, one answer token, EOS); typical values are 256 to 1024."
        )


class EncodedPairs(Dataset):
    """Tokenised prompt/answer pairs. ``index`` is the row's position in its set (batches carry it, e.g. to look up
    precomputed reference log-probs); ``group_id`` (if present) is kept as ``group_ids`` for masked strategies.

    Pairs longer than ``max_length`` are cut (the answer to leave room for one prompt token, then the prompt from
    the left) and reported once with counts (``truncation="warn"``), or refused (``"error"``). A ``max_length``
    below :data:`MIN_PAIR_LENGTH` is refused."""

    def __init__(
        self,
        records: list[dict],
        tokenizer,
        max_length: int,
        chat_template: bool = False,
        what: str = "records",
        truncation: str = "warn",
    ) -> None:
        check_max_length(max_length)
        self.rows = []
        cut_prompts, cut_answers = [], []
        for i, rec in enumerate(records):
            row, prompt_cut, answer_cut = encode_pair_with_cuts(
                tokenizer, str(rec["prompt"]), str(rec["answer"]), max_length, chat_template
            )
            if prompt_cut:
                cut_prompts.append(i)
            if answer_cut:
                cut_answers.append(i)
            row["index"] = i
            if "group_id" in rec and rec["group_id"] is not None:
                group = int(rec["group_id"])
                if not NEUTRAL_GROUP <= group < MAX_GROUPS:
                    raise ConfigError(
                        f"row {i} ({str(rec['prompt'])[:40]!r}) has group_id {group}; group ids are "
                        f"{NEUTRAL_GROUP} (neutral) to {MAX_GROUPS - 1} (one bit of the packed uint32 masks)."
                    )
                row["group_ids"] = group
            self.rows.append(row)
        cut = sorted(set(cut_prompts) | set(cut_answers))
        if cut:
            message = (
                f"{what}: {len(cut)} of {len(records)} pairs are longer than max_length={max_length} tokens and are "
                f"cut ({len(cut_prompts)} prompts from the left, {len(cut_answers)} answers; first row {cut[0]})"
            )
            if truncation == "error":
                raise ConfigError(f"{message}; raise max_length, shorten them, or set truncation: warn.")
            log.warning("%s; raise max_length to keep them whole, or set truncation: error to refuse them", message)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


class ForgetRetainDataModule(FingerprintedData, LightningDataModule):
    """Forget and retain prompt/answer pairs, batched in pairs for unlearning.

    Args:
        tokenizer_path: local tokenizer directory (usually the model directory).
        forget_path: forget set (JSONL file, ``datasets`` directory, or testbed splits directory).
        retain_path: retain set; ``None`` means the same location as ``forget_path`` (a splits directory).
        forget_split: split name of the forget set inside a splits directory.
        retain_split: split name of the retain set inside a splits directory.
        batch_size: forget pairs per batch and rank.
        retain_batch_size: retain pairs per batch and rank; ``None`` means ``batch_size``.
        max_length: longest tokenised pair (the prompt is truncated from the left).
        random_answers: also yield ``"mismatch"`` batches: forget prompts paired with random retain answers
            (GA-Retain's random-answer term).
        seed: seed of the random answer pairing and of the batch order (a function of seed and epoch, on every rank).
        num_workers: dataloader workers.
        prompt_key: column of the prompt in both sets (default ``prompt``; ``question`` is read when it is absent).
        answer_key: column of the answer in both sets.
        chat_template: render prompts with the tokenizer's chat template (a single user turn).
        truncation: pairs longer than ``max_length``: ``"warn"`` cuts them and logs the counts once per set,
            ``"error"`` refuses the data.
    """

    def __init__(
        self,
        tokenizer_path: str,
        forget_path: str,
        retain_path: str | None = None,
        forget_split: str = "forget",
        retain_split: str = "retain",
        batch_size: int = 4,
        retain_batch_size: int | None = None,
        max_length: int = 256,
        random_answers: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        chat_template: bool = False,
        truncation: Literal["warn", "error"] = "warn",
    ) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be positive, got {batch_size}.")
        check_max_length(max_length, "data.max_length")
        self.save_hyperparameters()
        self.tokenizer = None
        self.forget: EncodedPairs | None = None
        self.retain: EncodedPairs | None = None
        self.mismatch: EncodedPairs | None = None

    def preflight(self, stage: str | None = None) -> None:
        """Read, check and encode the sets now (the CLI calls this before the trainer writes anything); the
        trainer's own ``setup`` then finds them done."""
        self.setup(stage)

    @override
    def setup(self, stage: str | None = None) -> None:
        """Read, check and encode the forget and retain sets (and the random-answer pairs), once.

        Args:
            stage: the trainer's stage.

        Raises:
            ValueError: the forget and retain sets hold the same pairs (or a set is empty or malformed).
            FileNotFoundError: a set's path does not exist.
        """
        if self.forget is not None:
            return
        hp = self.hparams
        self.tokenizer = load_tokenizer(hp.tokenizer_path)
        keys = {"prompt_key": hp.prompt_key, "answer_key": hp.answer_key}
        forget = read_records(hp.forget_path, hp.forget_split, what="forget set", **keys)
        retain = read_records(hp.retain_path or hp.forget_path, hp.retain_split, what="retain set", **keys)
        pairs = [[(r["prompt"], r["answer"]) for r in records] for records in (forget, retain)]
        if sorted(pairs[0]) == sorted(pairs[1]):
            raise ConfigError(
                f"the forget set ({hp.forget_path}) and the retain set ({hp.retain_path or hp.forget_path}) hold the "
                f"same {len(forget)} pairs: unlearning would push each answer down and up at once. Give the retain "
                "set its own file (or split)."
            )
        cut = hp.get("truncation", "warn")
        self.forget = EncodedPairs(forget, self.tokenizer, hp.max_length, hp.chat_template, "forget set", cut)
        self.retain = EncodedPairs(retain, self.tokenizer, hp.max_length, hp.chat_template, "retain set", cut)
        if hp.random_answers:
            rng = random.Random(hp.seed)
            mismatched = [{"prompt": f["prompt"], "answer": rng.choice(retain)["answer"]} for f in forget]
            self.mismatch = EncodedPairs(mismatched, self.tokenizer, hp.max_length, hp.chat_template, "mismatch", cut)

    def _collate(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        return pad_batch(rows, self.tokenizer.pad_token_id)

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool, offset: int = 0) -> DataLoader:
        common = {
            "batch_size": batch_size,
            "collate_fn": partial(ForgetRetainDataModule._collate, self),
            "num_workers": self.hparams.num_workers,
        }
        if not shuffle:
            # its own generator: iterating never draws from the global RNG that dropout uses
            return DataLoader(dataset, generator=torch.Generator().manual_seed(self.hparams.seed), **common)
        # The order is a function of (seed + offset, epoch) on each data-parallel rank, and a checkpoint records
        # the position in the epoch: a resumed run replays exactly the batches the uninterrupted run would see.
        sampler = EpochSeededSampler(len(dataset), self.hparams.seed + offset)
        return ResumableLoader(dataset, sampler=sampler, position=trainer_position(self), **common)

    @override
    def train_dataloader(self) -> CombinedLoader:
        """``{"forget", "retain"[, "mismatch"]}`` loaders, each resumable; the forget set defines the epoch.

        Returns:
            A ``CombinedLoader``: ``min_size`` when retain is longer, else ``max_size_cycle`` (retain cycles).
        """
        hp = self.hparams
        retain_bs = hp.retain_batch_size or hp.batch_size
        loaders = {
            "forget": self._loader(self.forget, hp.batch_size, shuffle=True),
            "retain": self._loader(self.retain, retain_bs, shuffle=True, offset=1),
        }
        if self.mismatch is not None:
            loaders["mismatch"] = self._loader(self.mismatch, hp.batch_size, shuffle=True, offset=2)
        # The forget set defines the epoch: stop with it when retain is longer, cycle retain when it is shorter.
        forget_batches = -(-len(self.forget) // hp.batch_size)
        retain_batches = -(-len(self.retain) // retain_bs)
        return CombinedLoader(loaders, mode="min_size" if retain_batches >= forget_batches else "max_size_cycle")

    @override
    def val_dataloader(self) -> list[DataLoader]:
        """Forget (index 0) and retain (index 1) pairs in order, for the forget/retain NLL of a checkpoint."""
        return [self.forget_eval_dataloader(), self.retain_eval_dataloader()]

    def forget_eval_dataloader(self) -> DataLoader:
        """The whole forget set in order (no distributed sampler): for localisation and edit statistics."""
        return self._loader(self.forget, self.hparams.batch_size, shuffle=False)

    def retain_eval_dataloader(self) -> DataLoader:
        """The whole retain set in order (no distributed sampler)."""
        return self._loader(self.retain, self.hparams.retain_batch_size or self.hparams.batch_size, shuffle=False)
