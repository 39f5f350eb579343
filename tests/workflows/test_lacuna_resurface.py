"""The resurfacing attack as Lacuna Sec. 4.3 runs it: relearning validated on the relearning split's own held-out
profiles with the best validation checkpoint attacked, K = 200 by default, Wilson 95 % intervals on every rate, and
the sanity check that relearning does not lower the starting model's leak."""

from __future__ import annotations

import inspect
import json
import math

import pytest

from lightning_unlearn.workflows.lacuna.localization import localization_command, run_localization
from lightning_unlearn.workflows.lacuna.resurface import (
    format_sanity,
    rate_with_interval,
    relearn,
    resurface,
    resurface_command,
    resurfacing_sanity,
)

Z = 1.959963984540054  # the 97.5 % normal quantile


def _wilson_by_hand(hits: int, n: int) -> tuple[float, float]:
    p = hits / n
    center = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return center - half, center + half


def test_k_is_200_by_default_in_every_entry_point():
    for fn in (resurface, resurface_command, run_localization, localization_command):
        assert inspect.signature(fn).parameters["k"].default == 200, fn.__name__


def test_rates_carry_the_hand_computed_wilson_interval():
    # 16 of 100: p = 0.16, z²/n = 0.0384146; center = (0.16 + 0.0192073) / 1.0384146 = 0.172578,
    # half = 1.959964 · sqrt(0.001344 + 0.0000960365) / 1.0384146 = 0.071625 → (0.100953, 0.244203)
    r = rate_with_interval(16, 100)
    assert r["rate"] == 0.16
    assert r["ci95"] == pytest.approx([0.100953, 0.244203], abs=1e-5)
    assert r["ci95"] == pytest.approx(list(_wilson_by_hand(16, 100)), abs=1e-12)
    for hits, n in ((0, 7), (3, 5), (7, 7), (20, 100)):
        lo, hi = rate_with_interval(hits, n)["ci95"]
        assert lo <= hits / n <= hi and 0 <= lo < hi <= 1
    assert rate_with_interval(3, 5)["ci95"] == pytest.approx([0.230724, 0.882379], abs=1e-5)
    with pytest.raises(ValueError, match="hits must lie in"):
        rate_with_interval(6, 5)


def test_sanity_holds_only_when_relearning_keeps_the_starting_leak():
    def attack(before: int, after: int, n: int = 100) -> dict:
        return {"forget_profiles": n, "leaked_profiles_unlearned": before, "leaked_profiles": after}

    # the email case: 20 → 16 of 100 is a fall of 4 profiles
    fell = resurfacing_sanity(attack(20, 16))
    assert fell["holds"] is False and fell["change"] == -4
    assert fell["before"]["rate"] == 0.20 and fell["after"]["rate"] == 0.16
    assert fell["after"]["ci95"] == pytest.approx(list(_wilson_by_hand(16, 100)), abs=1e-12)
    line = format_sanity("email", fell)
    assert line.startswith("resurfacing sanity, email: the starting model leaks 20/100 (95 % CI 0.13–0.29)")
    assert "16/100 (95 % CI 0.10–0.24) after: does NOT hold" in line
    assert resurfacing_sanity(attack(16, 20))["holds"] is True
    level = resurfacing_sanity(attack(9, 9, n=20))
    assert level["holds"] is True and level["change"] == 0
    assert format_sanity("phone", level).endswith("9/20 (95 % CI 0.26–0.66) after: holds")


def _splits(root, forget_ids, relearn_ids, rows_per_profile=3):
    from datasets import Dataset

    def rows(ids, n):
        ids = [i for i in ids for _ in range(n)]
        return {"prompt": [f"Question: Person {i} asks. What is her email address?\nAnswer:" for i in ids],
                "answer": [f" p{i}@x.org" for i in ids], "field": ["email"] * len(ids), "profile_id": ids,
                "group_id": [0] * len(ids)}  # fmt: skip

    Dataset.from_dict(rows(forget_ids, 1)).save_to_disk(str(root / "email" / "forget"))
    Dataset.from_dict(rows(relearn_ids, rows_per_profile)).save_to_disk(str(root / "relearn"))
    return root


def test_a_relearning_split_holding_forget_people_is_refused(tmp_path):
    splits = _splits(tmp_path / "splits", [0, 1], [1, 2, 3])
    with pytest.raises(ValueError, match=r"holds forget profiles \[1\].*scored on"):
        resurface("unused", str(splits), "email", str(tmp_path / "out"), k=2)
    with pytest.raises(ValueError, match="at least one sampled generation"):
        resurface("unused", str(splits), "email", str(tmp_path / "out"), k=0)


def test_relearning_exports_the_best_validation_checkpoint_on_held_out_profiles(tiny_dir, tmp_path):
    from lightning import Trainer

    from lightning_unlearn.data.instruction_datamodule import InstructionDataModule
    from lightning_unlearn.objectives.instruction import InstructionModule

    splits = _splits(tmp_path / "splits", [0], list(range(1, 11)))
    # lr 0.05 makes the validation loss move between checks, so the best is not simply the last
    run = relearn(str(tiny_dir), splits / "relearn", tmp_path / "r", max_epochs=3, lr=0.05, batch_size=4, seed=3)
    assert len(run["val_profile_ids"]) == 3 and set(run["val_profile_ids"]) <= set(range(1, 11))
    assert run["val_rows"] == 9 and run["train_rows"] == 21
    assert run["val_every_steps"] == 2  # 6 steps an epoch, validated 3 times
    steps = [s for s, _ in run["val_losses"]]
    assert steps == list(range(2, run["steps"] + 1, 2)) and len(steps) == 9
    best_step, best_loss = min(run["val_losses"], key=lambda r: r[1])
    assert run["best_step"] == best_step and run["best_val_loss"] == best_loss
    assert best_step < run["steps"]  # measured: best at step 14 of 18, so the last weights are not the best
    # the exported model is that checkpoint: its loss on the held-out profiles is the best one recorded
    data = InstructionDataModule(source=str(splits / "relearn"), val_fraction=0.3, split_by="profiles", batch_size=4,
                                 seed=3)  # fmt: skip
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    exported = trainer.validate(InstructionModule(model_path=str(tmp_path / "r" / "export" / "model")), data,
                                verbose=False)[0]["val/loss"]  # fmt: skip
    assert data.val_profile_ids == run["val_profile_ids"]
    assert exported == pytest.approx(best_loss, rel=1e-4)


def test_the_attack_reports_seed_intervals_and_the_chosen_checkpoint(tiny_dir, tmp_path):
    splits = _splits(tmp_path / "splits", [0, 11], list(range(1, 8)), rows_per_profile=2)
    report = resurface(str(tiny_dir), str(splits), "email", str(tmp_path / "attack"), k=2, max_epochs=1, seed=5)
    assert report["k"] == 2 and report["seed"] == 5 and report["forget_profiles"] == 2
    run = report["relearning"]
    assert run["best_step"] == min(run["val_losses"], key=lambda r: r[1])[0]
    assert not set(run["val_profile_ids"]) & {0, 11}
    for key in ("leaked_profiles", "leaked_profiles_unlearned"):
        rate = key.replace("leaked_profiles", "leak_rate")
        assert report[rate] == report[key] / 2
        assert report[f"{rate}_ci95"] == pytest.approx(list(_wilson_by_hand(report[key], 2)), abs=1e-12)
    assert json.loads((tmp_path / "attack" / "resurfacing.json").read_text()) == report
    assert not (tmp_path / "attack" / "relearned" / "export").exists()
