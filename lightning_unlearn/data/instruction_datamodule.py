"""QA instruction-tuning batches (Lacuna Section 3.3): the instruction profiles' QA pairs, split 70/30 into
train/validation by a seeded shuffle; labels cover the answer only.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch
from lightning_unlearn.data.fingerprint import FingerprintedData
from lightning_unlearn.data.lacuna_datamodule import resolve_tokenizer_path
from lightning_unlearn.data.sampling import EpochSeededSampler, ResumableLoader, trainer_position
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.models import load_tokenizer


class InstructionDataModule(FingerprintedData, LightningDataModule):
    """Prompt/answer pairs for LoRA instruction tuning.

    Args:
        source: a ``datasets`` directory with ``prompt``/``answer`` columns (e.g. a testbed's ``instruct_qa`` or
            the ``relearn`` split for the resurfacing attack). ``None`` = ``<data_dir>/instruct_qa``.
        data_dir: testbed data directory (used when ``source`` is ``None``; one of the two is required).
        tokenizer_dir: tokenizer directory; ``None`` = the model's (``LightningModule.tokenizer_dir``).
        val_fraction: share held out for validation (Lacuna: 0.3).
        split_by: ``"rows"`` holds out ``val_fraction`` of the pairs; ``"profiles"`` holds out that share of the
            profiles (``profile_id`` column) with all their pairs, so validation measures answering about people
            the adapter never saw rather than recalling the training people's answers.
        max_length: tokens per pair.
        batch_size: pairs per step.
        seed: seed of the split and of the per-epoch order.
    """

    def __init__(
        self,
        source: str | None = None,
        data_dir: str | None = None,
        tokenizer_dir: str | None = None,
        val_fraction: float = 0.3,
        split_by: str = "rows",
        max_length: int = 96,
        batch_size: int = 16,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if source is None and data_dir is None:
            raise ConfigError(
                "InstructionDataModule needs source (a datasets directory of prompt/answer pairs) or data_dir (a "
                "testbed data directory, e.g. runs/lacuna/data); give one."
            )
        if not 0 <= val_fraction < 1:
            raise ConfigError(f"val_fraction={val_fraction} must be in [0, 1).")
        if split_by not in ("rows", "profiles"):
            raise ConfigError(f"split_by={split_by!r} is not 'rows' or 'profiles'.")
        self.save_hyperparameters()
        self.train_rows: list[dict] | None = None
        self.val_rows: list[dict] = []
        self.val_profile_ids: list | None = None  # the held-out profiles when split_by="profiles"
        self.pad_token_id = 0

    @override
    def setup(self, stage: str) -> None:
        """Read and encode the instruction QA, and split it into training and held-out rows (once).

        Args:
            stage: the trainer's stage.

        Raises:
            FileNotFoundError: the instruction data does not exist.
            ValueError: the data is empty, or ``split_by='profiles'`` without a ``profile_id`` column or with too
                few profiles to split.
        """
        if self.train_rows is not None:
            return
        from datasets import load_from_disk

        hp = self.hparams
        path = Path(hp.source) if hp.source is not None else Path(hp.data_dir) / "instruct_qa"
        if not path.exists():
            raise MissingPathError(f"instruction data {str(path)!r} does not exist; build the testbed data first.")
        ds = load_from_disk(str(path))
        if len(ds) == 0:
            raise ConfigError(f"instruction data {str(path)!r} is empty.")
        tokenizer = load_tokenizer(resolve_tokenizer_path(self, hp.tokenizer_dir))
        self.pad_token_id = tokenizer.pad_token_id
        rows = [encode_prompt_answer(tokenizer, p, a, hp.max_length) for p, a in zip(ds["prompt"], ds["answer"])]
        order = list(range(len(rows)))
        random.Random(hp.seed).shuffle(order)
        if hp.split_by == "rows":
            held_out = set(order[: int(round(len(rows) * hp.val_fraction))])
        else:
            if "profile_id" not in ds.column_names:
                raise ConfigError(
                    f"split_by='profiles' needs a profile_id column in {str(path)!r} (it has {ds.column_names}); "
                    "use split_by='rows'."
                )
            people = sorted(set(ds["profile_id"]))
            random.Random(hp.seed).shuffle(people)
            n_val = int(round(len(people) * hp.val_fraction))
            if hp.val_fraction > 0 and not 0 < n_val < len(people):
                raise ConfigError(
                    f"split_by='profiles' with val_fraction={hp.val_fraction} cannot split {len(people)} profiles "
                    "into non-empty train and validation sets; use more instruction profiles or split_by='rows'."
                )
            val_people = set(people[:n_val])
            self.val_profile_ids = sorted(val_people)
            held_out = {i for i, pid in enumerate(ds["profile_id"]) if pid in val_people}
        self.val_rows = [rows[i] for i in order if i in held_out]
        self.train_rows = [rows[i] for i in order if i not in held_out]

    @override
    def train_dataloader(self) -> DataLoader:
        """The training rows in a seeded order per epoch, resumable mid-epoch."""
        return ResumableLoader(
            self.train_rows,
            batch_size=self.hparams.batch_size,
            position=trainer_position(self),
            sampler=EpochSeededSampler(len(self.train_rows), self.hparams.seed),
            collate_fn=partial(pad_batch, pad_token_id=self.pad_token_id),
        )

    @override
    def val_dataloader(self) -> DataLoader:
        """The held-out rows, in order."""
        return DataLoader(
            self.val_rows,
            batch_size=self.hparams.batch_size,
            collate_fn=partial(pad_batch, pad_token_id=self.pad_token_id),
        )
