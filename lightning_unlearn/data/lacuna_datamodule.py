"""Continual-pretraining batches of the Lacuna testbed: PII documents and QA (``group_ids`` = the profile's group)
mixed with neutral text (``group_ids`` = −1, or with ``neutral_target="pre"`` a group's id and ``held`` = 1), and
with ``hold_other_groups`` QA of the other groups' people held under each group's id (``held`` = 1).

An epoch holds every PII sample of the selected groups once and ``round(n_pii · f / (1 − f))`` neutral chunks
(``f = neutral_fraction``; neutral paragraphs are tokenised and cut into ``max_length`` windows and cycled in a
seeded order). ``neutral_fraction = 1`` gives neutral text only (pretraining θ_pre). The order is a seeded
permutation per epoch (``set_epoch``), so a run resumed from a checkpoint sees the same batches as an
uninterrupted one.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from functools import partial

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_unlearn.data.collate import encode_document, pad_batch
from lightning_unlearn.data.fingerprint import FingerprintedData
from lightning_unlearn.data.pii import QA_FIELDS, answer_sentence, background_texts, qa_pair
from lightning_unlearn.data.sampling import EpochSeededSampler, ResumableLoader, trainer_position
from lightning_unlearn.data.templates import ANSWER_TEMPLATES, QUESTIONS
from lightning_unlearn.data.testbed_data import (
    LacunaDataConfig,
    build_testbed_data,
    load_holdout_profiles,
    load_table,
)
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.masks import NEUTRAL_GROUP
from lightning_unlearn.models import load_tokenizer

NEUTRAL_TARGETS = ("text", "pre")


def resolve_tokenizer_path(datamodule: LightningDataModule, tokenizer_dir: str | None) -> str:
    """``tokenizer_dir``, or the attached LightningModule's ``tokenizer_dir`` when it is ``None``."""
    if tokenizer_dir is not None:
        return tokenizer_dir
    module = datamodule.trainer.lightning_module if datamodule.trainer is not None else None
    path = getattr(module, "tokenizer_dir", None)
    if path is None:
        raise ConfigError("set data.tokenizer_dir: the model does not say where its tokenizer is (tokenizer_dir).")
    return path


class InjectionDataModule(FingerprintedData, LightningDataModule):
    """PII + neutral mixture for masked continual pretraining (and neutral-only pretraining).

    Args:
        data_dir: testbed data directory; built from ``data`` when missing (see ``build_testbed_data``).
        data: how to build the data directory.
        tokenizer_dir: tokenizer directory; ``None`` = the model's (``LightningModule.tokenizer_dir``).
        neutral_fraction: share of neutral samples in an epoch, in [0, 1]. Lacuna's mixture is 4.3B neutral
            tokens to 3.4B PII/QA tokens, about 0.55.
        neutral_target: what a neutral sample trains toward. ``"text"`` (Lacuna's mixture): next-token CE on the
            text, group −1, so it updates every weight. ``"pre"``: the sample is *held* to θ_pre — its rows carry
            ``held`` = 1 and the group ids of the selected groups in turn, so its gradient is masked to that
            group and the objective (``InjectionModule``) takes its KL to θ_pre instead of CE. It keeps general
            text without moving any weight outside the masks (docs/results/lacuna_memorization.md §9b, row G).
        hold_other_groups: QA rows of the testbed's *other* groups' people held to θ_pre under each selected group's
            id (``held`` = 1, masked to that group), this many per PII row of the group (0.25: 2 for every 8). Each
            group's change is then trained to leave every other group's people as θ_pre had them, which with group
            dropout makes the groups separable (docs/results/lacuna_memorization.md §9d-§9f). 0 = off. A held row
            about a person of another *injected* group carries that group in ``other_group`` (−1 on every other
            row): its target, θ_pre, is right only while that group's change is dropped, and the objective counts it
            only then.
        groups: inject only the PII of these group ids (0-based); ``None`` = all groups.
        include_documents: inject the five content-type documents.
        include_qa: inject the QA pairs (Lacuna: 2B of its 3.4B PII tokens).
        background_profiles: extra synthetic people (not in the testbed, never masked) whose documents and QA join
            the neutral text. Pretraining θ_pre on them teaches it the text genres (and heals the built-in one, cut
            from SmolLM2); leave 0 for injection.
        max_length: tokens per sample (neutral text is cut into windows of this length).
        neutral_max_length: cut neutral text into windows of at most this many tokens instead (BOS and EOS
            included; ``None`` = ``max_length``). Shorter windows of the same corpus make each neutral row cheaper
            while the epoch keeps its number of neutral rows.
        batch_size: samples per step.
        group_by_length: sort each run of this many batches by length before cutting it into batches (their order
            stays random), so short QA pairs are not padded to the length of documents; 0 = random batches.
        one_group_per_batch: every batch holds samples of one group (neutral text in batches of its own, held neutral
            text in its group's), as group dropout (``InjectionModule(drop_other_groups=…)``) needs; lengths are
            still grouped within a group.
        seed: seed of the neutral selection and of the per-epoch order.
        num_workers: dataloader workers.
    """

    def __init__(
        self,
        data_dir: str,
        data: LacunaDataConfig | None = None,
        tokenizer_dir: str | None = None,
        neutral_fraction: float = 0.55,
        neutral_target: str = "text",
        hold_other_groups: float = 0.0,
        groups: list[int] | None = None,
        include_documents: bool = True,
        include_qa: bool = True,
        background_profiles: int = 0,
        max_length: int = 128,
        neutral_max_length: int | None = None,
        batch_size: int = 16,
        group_by_length: int = 0,
        one_group_per_batch: bool = False,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if group_by_length < 0:
            raise ConfigError(f"group_by_length={group_by_length} must be >= 0 (0 = random batches).")
        if not 0 <= neutral_fraction <= 1:
            raise ConfigError(f"neutral_fraction={neutral_fraction} must be in [0, 1].")
        if neutral_target not in NEUTRAL_TARGETS:
            raise ConfigError(f"neutral_target={neutral_target!r}; use one of {', '.join(NEUTRAL_TARGETS)}.")
        if not 0 <= hold_other_groups < float("inf"):
            raise ConfigError(f"hold_other_groups={hold_other_groups} must be >= 0 (held rows per PII row; 0 = off).")
        if hold_other_groups and neutral_fraction == 1:
            raise ConfigError(
                "hold_other_groups holds QA under the injected groups' masks, and neutral_fraction 1 injects no group; "
                "set hold_other_groups 0 or neutral_fraction below 1."
            )
        if groups is not None and not groups:
            raise ConfigError("groups=[] selects no PII; give group ids or leave groups unset for all groups.")
        if neutral_max_length is not None and not 10 <= neutral_max_length <= max_length:
            raise ConfigError(
                f"neutral_max_length={neutral_max_length} must be between 10 (BOS, EOS and 8 tokens of text) and "
                f"max_length={max_length}, or null for max_length."
            )
        self.save_hyperparameters()
        self.data_config = LacunaDataConfig(**data) if isinstance(data, dict) else data or LacunaDataConfig()
        self.hparams["data"] = asdict(self.data_config)  # a plain dict keeps checkpoints weights_only-loadable
        self.rows: list[dict] | None = None
        self.pad_token_id = 0

    @override
    def prepare_data(self) -> None:
        """Build the testbed data in ``data_dir`` (profiles, documents, QA, neutral text) when missing."""
        build_testbed_data(self.hparams.data_dir, self.data_config)

    def tokenizer_corpus(self) -> list[str]:
        """Texts to train a tokenizer on: neutral paragraphs, PII documents and QA."""
        d = self.hparams.data_dir
        qa = load_table(d, "qa")
        return (
            list(load_table(d, "neutral")["text"])
            + list(load_table(d, "documents")["text"])
            + [p + a for p, a in zip(qa["prompt"], qa["answer"])]
        )

    def vocabulary_corpus(self) -> list[str]:
        """Every text the testbed's stages tokenize, to prune a vocabulary to: the tokenizer corpus, the instruction
        QA, every question wording about every profile (training, probe and paraphrase prompts) and the background
        people."""
        d, hp = self.hparams.data_dir, self.hparams
        profiles = list(load_table(d, "profiles"))
        instruct = load_table(d, "instruct_qa")
        questions = [
            pair["prompt"] + pair["answer"]
            for p in profiles + load_holdout_profiles(d)  # the held-out people: membership inference reads them
            for field in QA_FIELDS
            for pair in (qa_pair(p, field, question, []) for question in QUESTIONS[field])
        ]
        # the truth ratio's whole-sentence answers (data/splits.py), for the testbed's own people
        answers = [
            answer_sentence(p, f, t)
            for p in profiles
            for f in ANSWER_TEMPLATES
            for t in range(len(ANSWER_TEMPLATES[f]))
        ]
        names = {f"{p['first_name']} {p['last_name']}" for p in profiles}
        return (
            self.tokenizer_corpus()
            + [p + a for p, a in zip(instruct["prompt"], instruct["answer"])]
            + questions
            + answers
            + background_texts(hp.background_profiles, self.data_config.seed + 7919, names)
        )

    def pii_rows(self) -> list[dict]:
        """PII texts with their group ids, for the selected groups (validated)."""
        d, hp = self.hparams.data_dir, self.hparams
        num_groups = self.data_config.num_groups
        groups = list(range(num_groups)) if hp.groups is None else list(hp.groups)
        for g in groups:
            if not isinstance(g, int) or not 0 <= g < num_groups:
                raise ConfigError(f"group id {g!r} is out of range: the testbed has groups 0..{num_groups - 1}.")
        rows: list[dict] = []
        if hp.include_documents:
            docs = load_table(d, "documents")
            rows += [{"text": t, "group_id": g} for t, g in zip(docs["text"], docs["group_id"]) if g in groups]
        if hp.include_qa:
            qa = load_table(d, "qa")
            rows += [
                {"text": p + a, "group_id": g}
                for p, a, g in zip(qa["prompt"], qa["answer"], qa["group_id"])
                if g in groups
            ]
        if hp.neutral_fraction < 1:
            present = {r["group_id"] for r in rows}
            for g in groups:
                if g not in present:
                    raise ConfigError(
                        f"group {g} is empty: no PII sample belongs to it (profiles of group {g}, or "
                        "include_documents/include_qa). Give non-empty groups."
                    )
        return rows if hp.neutral_fraction < 1 else []

    @override
    def setup(self, stage: str) -> None:
        """Encode the PII rows of the selected groups, the neutral chunks and any rows held to θ_pre (once).

        Args:
            stage: the trainer's stage.

        Raises:
            ValueError: a group id out of range or without samples, no neutral chunk, or no other group to hold.
        """
        if self.rows is not None:
            return
        hp = self.hparams
        tokenizer = load_tokenizer(resolve_tokenizer_path(self, hp.tokenizer_dir))
        self.pad_token_id = tokenizer.pad_token_id
        pii = [
            {**encode_document(tokenizer, r["text"], hp.max_length), "group_ids": int(r["group_id"])}
            for r in self.pii_rows()
        ]
        chunks = self._neutral_chunks(tokenizer)
        if hp.background_profiles:
            names = {f"{p['first_name']} {p['last_name']}" for p in load_table(hp.data_dir, "profiles")}
            background = background_texts(hp.background_profiles, self.data_config.seed + 7919, names)
            chunks += [{**encode_document(tokenizer, t, hp.max_length), "group_ids": NEUTRAL_GROUP} for t in background]
        if hp.neutral_fraction == 1:
            n_neutral = len(chunks)
        else:
            n_neutral = int(round(len(pii) * hp.neutral_fraction / (1 - hp.neutral_fraction)))
        order = list(range(len(chunks)))
        random.Random(hp.seed).shuffle(order)
        neutral = [chunks[order[i % len(order)]] for i in range(n_neutral)]
        held = self._other_groups_held(tokenizer, pii)
        if (hp.neutral_target == "pre" and neutral and pii) or held:
            # held to θ_pre, each under one selected group's mask in turn
            groups = sorted({r["group_ids"] for r in pii})
            pii = [{**r, "held": 0, "other_group": -1} for r in pii]
            if hp.neutral_target == "pre":
                neutral = [{**r, "group_ids": groups[i % len(groups)], "held": 1, "other_group": -1}
                           for i, r in enumerate(neutral)]  # fmt: skip
            else:
                neutral = [{**r, "held": 0, "other_group": -1} for r in neutral]
        self.rows = pii + neutral + held

    def _other_groups_held(self, tokenizer, pii: list[dict]) -> list[dict]:
        """``hold_other_groups`` × (a group's PII rows) QA rows of every other group's people, for each injected
        group, under its id and held: each group's pool in a seeded order, cycled. ``other_group``: the group of the
        row's person when that group is injected too, else −1."""
        hp = self.hparams
        if not hp.hold_other_groups or not pii:
            return []
        qa = load_table(hp.data_dir, "qa")
        rows = []
        injected = {r["group_ids"] for r in pii}
        for g in sorted(injected):
            pool = [(p + a, h) for p, a, h in zip(qa["prompt"], qa["answer"], qa["group_id"]) if h != g]
            if not pool:
                raise ConfigError(f"hold_other_groups: the testbed has no group but {g} to hold; set it to 0.")
            random.Random(hp.seed * 1_000_003 + g).shuffle(pool)
            count = int(round(sum(r["group_ids"] == g for r in pii) * hp.hold_other_groups))
            for text, h in (pool[i % len(pool)] for i in range(count)):
                row = encode_document(tokenizer, text, hp.max_length)
                rows.append({**row, "group_ids": g, "held": 1, "other_group": int(h) if h in injected else -1})
        return rows

    def _neutral_chunks(self, tokenizer) -> list[dict]:
        hp = self.hparams
        body = (hp.neutral_max_length or hp.max_length) - 2  # bos + eos
        chunks = []
        for text in load_table(hp.data_dir, "neutral")["text"]:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            for start in range(0, len(ids), body):
                piece = ids[start : start + body]
                if len(piece) < 8:
                    continue
                full = [tokenizer.bos_token_id, *piece, tokenizer.eos_token_id]
                chunks.append({"input_ids": full, "labels": list(full), "group_ids": NEUTRAL_GROUP})
        if not chunks:
            raise ConfigError(f"the neutral corpus of {hp.data_dir!r} yields no text chunk.")
        return chunks

    @override
    def train_dataloader(self) -> DataLoader:
        """The rows in a seeded order per epoch (by length, or one group per batch, when asked), resumable mid-epoch."""
        return ResumableLoader(
            self.rows,
            batch_size=self.hparams.batch_size,
            position=trainer_position(self),
            sampler=EpochSeededSampler(
                len(self.rows),
                self.hparams.seed,
                lengths=[len(r["input_ids"]) for r in self.rows],
                batch_size=self.hparams.batch_size,
                group_batches=self.hparams.group_by_length,
                batch_keys=[r["group_ids"] for r in self.rows] if self.hparams.one_group_per_batch else None,
            ),
            collate_fn=partial(pad_batch, pad_token_id=self.pad_token_id),
            num_workers=self.hparams.num_workers,
        )
