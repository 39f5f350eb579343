"""Forget/retain batches whose forget rows also carry a preferred answer, for DPO.

Each forget row keeps its answer as the dispreferred one (``input_ids``/``labels``, as in
:class:`~lightning_unlearn.data.unlearning.ForgetRetainDataModule`) and gains ``preferred_ids``: the token ids of the
``preferred_key`` column's answer (EOS included). The DPO objective pairs them with the row's own prompt tokens
(:func:`lightning_unlearn.data.collate.with_answers`), so preferred and dispreferred share the prompt exactly and
travel in one batch through every sampler and rank.
"""

from __future__ import annotations

from typing import Literal

from typing_extensions import override

from lightning_unlearn.data.collate import encode_answer
from lightning_unlearn.data.records import read_records
from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.errors import ConfigError


class PreferenceDataModule(ForgetRetainDataModule):
    """:class:`~lightning_unlearn.data.unlearning.ForgetRetainDataModule` plus a preferred answer per forget row.

    Args:
        tokenizer_path: local tokenizer directory (usually the model directory).
        forget_path: forget set with a ``preferred_key`` column.
        retain_path: retain set; ``None`` means the same location as ``forget_path`` (a splits directory).
        forget_split: split name of the forget set inside a splits directory.
        retain_split: split name of the retain set inside a splits directory.
        batch_size: forget pairs per batch and rank.
        retain_batch_size: retain pairs per batch and rank; ``None`` means ``batch_size``.
        max_length: longest tokenised (forget) pair; the preferred pair is not cut again.
        random_answers: also yield ``"mismatch"`` batches (forget prompts with random retain answers).
        seed: seed of the batch order.
        num_workers: dataloader workers.
        prompt_key: column of the prompt in both sets.
        answer_key: column of the (dispreferred) answer in both sets.
        preferred_key: column of the preferred answer in the forget set.
        chat_template: render prompts with the tokenizer's chat template (a single user turn).
        truncation: ``"warn"`` cuts pairs longer than ``max_length``, ``"error"`` refuses them.
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
        preferred_key: str = "preferred",
        chat_template: bool = False,
        truncation: Literal["warn", "error"] = "warn",
    ) -> None:
        super().__init__(
            tokenizer_path,
            forget_path,
            retain_path,
            forget_split,
            retain_split,
            batch_size,
            retain_batch_size,
            max_length,
            random_answers,
            seed,
            num_workers,
            prompt_key,
            answer_key,
            chat_template,
            truncation,
        )  # its save_hyperparameters() records this __init__'s arguments (all of the parent's, and preferred_key)

    @override
    def setup(self, stage: str | None = None) -> None:
        """Set up as ``ForgetRetainDataModule`` does, then add each forget row's preferred answer as ``preferred_ids``.

        Args:
            stage: the trainer's stage.

        Raises:
            ValueError: a forget row without a preferred answer in ``preferred_key``.
        """
        if self.forget is not None:
            return
        super().setup(stage)
        hp = self.hparams
        records = read_records(hp.forget_path, hp.forget_split, hp.prompt_key, hp.answer_key, what="forget set")
        missing = [i for i, r in enumerate(records) if r.get(hp.preferred_key) in (None, "")]
        if missing:
            raise ConfigError(
                f"forget set row {missing[0]} (of {len(missing)}) has no preferred answer in column "
                f"{hp.preferred_key!r}; give one per row or set data.preferred_key to the column that holds it."
            )
        for row, record in zip(self.forget.rows, records):
            row["preferred_ids"] = encode_answer(self.tokenizer, str(record[hp.preferred_key]))
