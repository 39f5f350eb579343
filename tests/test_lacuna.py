"""Lacuna injection and instruction stages on a tiny model: locality, resume, bad input, exports, configs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from safetensors.torch import load_file

from lightning_unlearn.configs import config_root
from lightning_unlearn.data.instruction_datamodule import InstructionDataModule
from lightning_unlearn.data.lacuna_datamodule import InjectionDataModule
from lightning_unlearn.data.pii import PROFILE_FIELDS, generate_profiles
from lightning_unlearn.data.testbed_data import LacunaDataConfig
from lightning_unlearn.masks import LazyMasks, sample_masks, save_masks
from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama, load_tokenizer
from lightning_unlearn.objectives.injection import InjectionModule
from lightning_unlearn.objectives.instruction import InstructionModule
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.strategies import MaskedSingleDeviceStrategy
from lightning_unlearn.workflows.lacuna.commands import main as lacuna_main
from lightning_unlearn.workflows.lacuna.locality import locality_report

CONFIGS = config_root() / "lacuna"


def small_data(**overrides) -> LacunaDataConfig:
    kwargs = dict(
        num_profiles=12, qa_per_field=1, instruct_questions=2, neutral_max_paragraphs=20, utility_paragraphs=4
    )
    kwargs.update(overrides)
    return LacunaDataConfig(**kwargs)


def make_trainer(root, max_epochs=1, max_steps=-1, callbacks=(), checkpoint=False, strategy=True, precision="32-true"):
    return Trainer(
        accelerator="cpu",
        precision=precision,
        devices=1,
        strategy=strategy if not isinstance(strategy, bool) else MaskedSingleDeviceStrategy() if strategy else "auto",
        max_epochs=max_epochs,
        max_steps=max_steps,
        default_root_dir=str(root),
        logger=False,
        enable_checkpointing=checkpoint,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        num_sanity_val_steps=0,
    )


def injection(tiny_dir, data_dir, **kw):
    data_keys = ("neutral_fraction", "neutral_target", "groups", "data", "batch_size", "group_by_length",
                 "one_group_per_batch", "hold_other_groups", "include_documents", "neutral_max_length")  # fmt: skip
    data_kw = {k: kw.pop(k) for k in data_keys if k in kw}
    data_kw.setdefault("data", small_data())
    optim_keys = ("weight_decay", "warmup_steps", "schedule", "decay_fraction", "cycles")
    optim = {"lr": 1e-2, **{k: kw.pop(k) for k in optim_keys if k in kw}}
    module = InjectionModule(model_path=str(tiny_dir), optim=OptimizerConfig(**optim), **kw)
    data = InjectionDataModule(
        data_dir=str(data_dir), max_length=48, batch_size=data_kw.pop("batch_size", 4), **data_kw
    )
    return module, data


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])  # bf16-mixed: autocast, as on a GPU
def test_locality_only_group_bits_change(tiny_dir, tmp_path, precision):
    module, data = injection(tiny_dir, tmp_path / "data", neutral_fraction=0.0, groups=[2], weight_decay=0.0)
    make_trainer(tmp_path / "run", max_steps=4, precision=precision).fit(module, data)
    # one device: the strategy made every lazy mask once and kept them (not remade on each step)
    assert type(module.packed_masks) is dict
    export = tmp_path / "run" / "export"
    assert {p.name for p in export.iterdir()} >= {"pre", "inj", "masks.safetensors"}
    umask = os.umask(0)
    os.umask(umask)
    assert (export / "masks.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    assert export.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700
    report = locality_report(str(export), [2])
    assert report["changed_outside"] == 0, report["offenders"]
    assert report["changed_inside"] > 100
    # the other groups' elements did not move either
    assert locality_report(str(export), [0, 1, 3, 4, 5])["changed_inside"] == 0
    lacuna_main(["locality", "--export", str(export), "--group", "[2]"])  # the command-line check passes
    with pytest.raises(SystemExit, match="changed outside groups"):
        lacuna_main(["locality", "--export", str(export), "--group", "[3]"])
    if precision == "32-true":
        # the export's masks record their θ_pre: the same shapes with other weights are another model's
        from lightning_unlearn.cli import main as cli_main
        from lightning_unlearn.models import load_causal_lm

        other = load_causal_lm(str(export / "inj"))
        other.save_pretrained(export / "pre")
        with pytest.raises(SystemExit, match=r"lacuna locality: error: masks .* were sampled on another θ_pre") as err:
            cli_main(["lacuna", "locality", "--export", str(export), "--group", "[2]"])
        assert "\n" not in str(err.value)


def test_freezing_outside_the_masks_trains_the_same_weights(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    exports = {}
    for freeze in (False, True):
        module, data = injection(tiny_dir, tmp_path / "data", neutral_fraction=0.0, weight_decay=0.0,
                                 freeze_outside_masks=freeze)  # fmt: skip
        make_trainer(tmp_path / f"run{freeze}", max_steps=3).fit(module, data)
        frozen = {n for n, p in module.model.named_parameters() if not p.requires_grad}
        exports[freeze] = load_file(str(tmp_path / f"run{freeze}" / "export" / "inj" / "model.safetensors"))
        if freeze:  # the embeddings, the norms and the last two blocks: no group's mask touches them
            assert any("embed_tokens" in n for n in frozen) and any(".layers.3." in n for n in frozen), frozen
            assert not any(".layers.0." in n and "proj" in n for n in frozen), frozen
        else:
            assert not frozen
    assert exports[True].keys() == exports[False].keys()
    for name, tensor in exports[False].items():
        assert torch.equal(tensor, exports[True][name]), name  # fp32 on one device: bit for bit the same run
    pre = load_file(str(tmp_path / "runTrue" / "export" / "pre" / "model.safetensors"))
    assert any(not torch.equal(pre[n], exports[True][n]) for n in pre)  # and training moved something

    for kwargs, match in (
        ({"neutral_fraction": 0.5, "weight_decay": 0.0}, "neutral text"),
        ({"neutral_fraction": 0.0, "weight_decay": 0.1}, "weight decay"),
    ):
        module, data = injection(tiny_dir, tmp_path / "data", freeze_outside_masks=True, **kwargs)
        with pytest.raises(ValueError, match=match):
            make_trainer(tmp_path / "bad", max_steps=1).fit(module, data)


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_group_dropout_trains_each_group_with_the_others_at_theta_pre(tiny_dir, tmp_path, p):
    from lightning_unlearn.masks import canonical_name, group_mask, load_masks
    from lightning_unlearn.models import load_weights

    pre = load_weights(tiny_dir)
    module, data = injection(tiny_dir, tmp_path / "data", neutral_fraction=0.0, weight_decay=0.0,
                             drop_other_groups=p, one_group_per_batch=True, batch_size=2)  # fmt: skip
    seen = []  # per step: the batch's group, and whether every other group's elements held θ_pre in its forward
    loss = module._loss

    def recording_loss(batch):
        (g,) = set(batch["group_ids"].tolist())
        params = {canonical_name(n): q.detach() for n, q in module.model.named_parameters()}
        at_pre = all(torch.equal(params[n][m], pre[n][m]) for n, b in module.packed_masks.items()
                     for m in [group_mask(b, [h for h in range(6) if h != g])] if m.any())  # fmt: skip
        seen.append((g, at_pre))
        return loss(batch)

    module._loss = recording_loss
    make_trainer(tmp_path / "run", max_steps=12).fit(module, data)
    assert len({g for g, _ in seen}) > 2  # one group a batch, several groups over the run
    if p == 1.0:
        assert all(at_pre for _, at_pre in seen)
    else:
        assert not all(at_pre for _, at_pre in seen[6:])  # without dropout, the other groups' changes are in
    # the dropped values were put back before each step: every trained group's change is in θ_inj
    export = tmp_path / "run" / "export"
    inj, packed = load_weights(export / "inj"), dict(load_masks(export / "masks.safetensors")[0])
    for g in {g for g, _ in seen}:
        assert any(not torch.equal(inj[n][group_mask(b, g)], pre[n][group_mask(b, g)]) for n, b in packed.items())
    assert locality_report(str(export), list(range(6)))["changed_outside"] == 0
    with pytest.raises(ValueError, match="drop_other_groups needs masked=true"):
        InjectionModule(model_path=str(tiny_dir), masked=False, drop_other_groups=0.5)


def test_group_dropout_sets_exactly_the_dropped_groups_to_theta_pre_and_back(tiny_dir):
    from lightning_unlearn.masks import canonical_name, group_mask
    from lightning_unlearn.models import load_causal_lm, load_weights
    from lightning_unlearn.objectives.group_dropout import GroupDropout

    pre = load_weights(tiny_dir)
    model = load_causal_lm(tiny_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for q in model.parameters():
            q.add_(torch.randn_like(q))  # every element away from θ_pre
    masks = sample_masks(model, 6, 0.05, seed=0)
    trained = {canonical_name(n): q.detach().clone() for n, q in model.named_parameters()}
    swap = GroupDropout(pre, masks, 6, 1.0)
    for dropped in ([2], [0, 3, 5], list(range(6)), []):
        swap.drop(model, dropped)
        now = {canonical_name(n): q.detach() for n, q in model.named_parameters()}
        for name, value in now.items():
            reset = torch.zeros_like(value, dtype=torch.bool)
            if name in masks and dropped:
                reset = group_mask(masks[name], dropped)
            assert torch.equal(value, torch.where(reset, pre[name], trained[name])), (dropped, name)
        swap.restore()
        assert all(torch.equal(q.detach(), trained[canonical_name(n)]) for n, q in model.named_parameters())
    swap.drop(model, [1])
    with pytest.raises(RuntimeError, match="twice"):
        swap.drop(model, [2])


def test_unmasked_control_updates_outside_the_masks(tiny_dir, tmp_path):
    module, data = injection(tiny_dir, tmp_path / "data", neutral_fraction=0.0, groups=[2], masked=False)
    make_trainer(tmp_path / "run", max_steps=2).fit(module, data)
    report = locality_report(str(tmp_path / "run" / "export"), [2])
    assert report["changed_outside"] > 1000
    assert json.loads((tmp_path / "run" / "export" / "run.json").read_text())["masked"] is False


def test_export_is_loadable_by_plain_transformers(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    module, data = injection(tiny_dir, tmp_path / "data", neutral_fraction=0.5)
    make_trainer(tmp_path / "run", max_steps=2).fit(module, data)
    inj = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "export" / "inj", local_files_only=True)
    final = {k: v for k, v in module.model.state_dict().items()}
    for k, v in inj.state_dict().items():
        assert torch.equal(v, final[k])
    pre = load_file(str(tmp_path / "run" / "export" / "pre" / "model.safetensors"))
    orig = load_file(str(Path(tiny_dir) / "model.safetensors"))
    assert all(torch.equal(pre[k], orig[k]) for k in orig)
    # the export rebuilds the masks training used (the module keeps no full copy of them)
    exported = load_file(str(tmp_path / "run" / "export" / "masks.safetensors"))
    trained_with = sample_masks(module.model, 6, 0.05, seed=0)
    assert exported.keys() == trained_with.keys() and all(torch.equal(exported[k], trained_with[k]) for k in exported)


def test_the_module_keeps_no_full_mask_copy(tiny_dir):
    def uint32_dicts(module):
        def is_masks(v):
            return isinstance(v, dict) and v and all(getattr(t, "dtype", None) == torch.uint32 for t in v.values())

        return [k for k, v in vars(module).items() if is_masks(v)]

    control = InjectionModule(model_path=str(tiny_dir), masked=False)
    control.configure_model()
    assert control.packed_masks is None and uint32_dicts(control) == []
    masked = InjectionModule(model_path=str(tiny_dir))
    masked.configure_model()
    # packed_masks holds no tensor at all until the strategy reads it (one device: every mask once; FSDP: shards)
    assert uint32_dicts(masked) == [] and isinstance(masked.packed_masks, LazyMasks)
    expected = sample_masks(masked.model, 6, 0.05, seed=0)
    assert masked.packed_masks.keys() == expected.keys()
    assert all(torch.equal(masked.packed_masks[k], expected[k]) for k in expected)


class _SwapMasksFile(Callback):
    """Overwrites the run's masks file with another seed's masks after the first step."""

    def __init__(self, path, model) -> None:
        self.path, self.model = path, model

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 1:
            save_masks(self.path, sample_masks(self.model, seed=7))


def test_a_masks_file_changed_during_the_run_is_not_exported(tiny_dir, tmp_path):
    from lightning_unlearn.models import load_causal_lm

    path = tmp_path / "masks.safetensors"
    save_masks(path, sample_masks(load_causal_lm(str(tiny_dir)), seed=0))
    module, data = injection(tiny_dir, tmp_path / "data", masks_path=str(path))
    swap = _SwapMasksFile(path, load_causal_lm(str(tiny_dir)))
    trainer = make_trainer(tmp_path / "run", max_steps=2, callbacks=[swap])
    with pytest.raises(RuntimeError, match="masks rebuilt for the export differ"):
        trainer.fit(module, data)
    assert not (tmp_path / "run" / "export").exists()


class _Crash(Callback):
    """Simulates a killed process: raises once training reaches ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step:
            raise RuntimeError("killed")


RESUME_RECIPES = {
    "mixture": (dict(neutral_fraction=0.5, weight_decay=0.01, warmup_steps=3), "32-true"),
    # the built-in default's recipe (neutral text held to θ_pre, which is read from disk again on resume, wsd
    # schedule, batches grouped by length), under bf16 autocast as on a GPU
    "builtin": (
        dict(
            neutral_fraction=0.2,
            neutral_target="pre",
            neutral_kl_weight=4.0,
            weight_decay=0.0,
            freeze_outside_masks=True,
            warmup_steps=3,
            schedule="wsd",
            group_by_length=2,
        ),
        "bf16-mixed",
    ),
}


@pytest.mark.parametrize("recipe", sorted(RESUME_RECIPES))
def test_resume_after_kill_matches_uninterrupted(tiny_dir, tmp_path, recipe):
    torch.manual_seed(0)
    kw, precision = RESUME_RECIPES[recipe]
    ckpt = lambda: ModelCheckpoint(save_last=True, every_n_epochs=1, save_top_k=1)  # noqa: E731
    trainer = lambda root, callbacks: make_trainer(  # noqa: E731
        root, max_epochs=3, callbacks=callbacks, checkpoint=True, precision=precision)  # fmt: skip
    module, data = injection(tiny_dir, tmp_path / "data", **kw)
    trainer(tmp_path / "full", [ckpt()]).fit(module, data)
    full = {k: v.clone() for k, v in module.model.state_dict().items()}
    steps_per_epoch = module.trainer.global_step // 3

    module, data = injection(tiny_dir, tmp_path / "data", **kw)
    crashing = trainer(tmp_path / "killed", [ckpt(), _Crash(steps_per_epoch + 2)])
    with pytest.raises(RuntimeError, match="killed"):
        crashing.fit(module, data)
    assert not (tmp_path / "killed" / "export").exists()  # a killed run exports nothing
    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    assert last.exists()

    module, data = injection(tiny_dir, tmp_path / "data", **kw)
    trainer(tmp_path / "killed", [ckpt()]).fit(module, data, ckpt_path="last")
    for k, v in module.model.state_dict().items():
        torch.testing.assert_close(v, full[k], rtol=0, atol=1e-6)


def test_bad_profiles_jsonl_leaves_no_export(tiny_dir, tmp_path):
    rows = generate_profiles(12, seed=0)
    del rows[4]["email"]
    path = tmp_path / "profiles.jsonl"
    path.write_text("\n".join(json.dumps({k: r[k] for k in PROFILE_FIELDS if k in r}) for r in rows))
    module, data = injection(tiny_dir, tmp_path / "data", data=small_data(profiles_jsonl=str(path)))
    with pytest.raises(ValueError, match=r"profiles\.jsonl:5: profile is missing field 'email'"):
        make_trainer(tmp_path / "run", max_steps=1).fit(module, data)
    assert not (tmp_path / "run" / "export").exists() and not (tmp_path / "data").exists()


def test_masks_from_another_model_leave_no_export(tiny_dir, tiny_tokenizer, tmp_path):
    other = build_tiny_llama(tiny_tokenizer, TinyLlamaConfig(hidden_size=16, num_layers=4, num_heads=2))
    save_masks(tmp_path / "other.safetensors", sample_masks(other))
    module, data = injection(tiny_dir, tmp_path / "data", masks_path=str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="masks do not match the model"):
        make_trainer(tmp_path / "run", max_steps=1).fit(module, data)
    assert not (tmp_path / "run" / "export").exists()


def test_empty_group_is_an_error(tiny_dir, tmp_path):
    rows = generate_profiles(12, seed=0)
    path = tmp_path / "profiles.jsonl"
    # groups 0..4 only: group 5 has no profile
    path.write_text(
        "\n".join(json.dumps({**{k: r[k] for k in PROFILE_FIELDS}, "group_id": i % 5}) for i, r in enumerate(rows))
    )
    module, data = injection(tiny_dir, tmp_path / "data", data=small_data(profiles_jsonl=str(path)))
    with pytest.raises(ValueError, match="group 5 is empty"):
        make_trainer(tmp_path / "run", max_steps=1).fit(module, data)
    # a mask group without elements
    module, data = injection(tiny_dir, tmp_path / "data2", coverage=1e-7)
    with pytest.raises(ValueError, match="mask group 0 is empty"):
        make_trainer(tmp_path / "run", max_steps=1).fit(module, data)
    assert not (tmp_path / "run" / "export").exists()


def test_missing_neutral_corpus_is_an_error(tiny_dir, tmp_path):
    module, data = injection(tiny_dir, tmp_path / "data", data=small_data(neutral=str(tmp_path / "no_such_dir")))
    with pytest.raises(FileNotFoundError, match="neutral corpus path .*no_such_dir.* does not exist"):
        make_trainer(tmp_path / "run", max_steps=1).fit(module, data)
    assert not (tmp_path / "run" / "export").exists() and not (tmp_path / "data").exists()


def test_groups_subset_and_neutral_fraction(tiny_dir, tmp_path):
    module, data = injection(tiny_dir, tmp_path / "data", neutral_fraction=0.5, groups=[0, 3])
    data.trainer = make_trainer(tmp_path / "run")
    data.trainer.strategy.connect(module)
    data.prepare_data()
    data.setup("fit")
    gids = [r["group_ids"] for r in data.rows]
    assert set(gids) == {-1, 0, 3}
    assert sum(g == -1 for g in gids) == sum(g != -1 for g in gids)
    with pytest.raises(ValueError, match="out of range"):
        InjectionDataModule(data_dir=str(tmp_path / "data"), data=small_data(), groups=[6]).pii_rows()


def test_neutral_windows_cut_shorter_keep_the_text_and_the_epochs_neutral_rows(tiny_dir, tmp_path):
    def rows(**kw):
        module, data = injection(tiny_dir, tmp_path / "data", neutral_fraction=0.5, groups=[0, 3], **kw)
        data.trainer = make_trainer(tmp_path / "run")
        data.trainer.strategy.connect(module)
        data.prepare_data()
        data.setup("fit")
        tokenizer = load_tokenizer(str(tiny_dir))
        return data.rows, data._neutral_chunks(tokenizer)

    full_rows, full = rows()
    short_rows, short = rows(neutral_max_length=16)
    assert max(len(c["input_ids"]) for c in full) > 16 and max(len(c["input_ids"]) for c in short) <= 16
    assert len(short) > len(full)
    # the windows hold the same text, cut at other places (BOS and EOS around each; windows under 8 tokens dropped)
    body = [t for c in short for t in c["input_ids"][1:-1]]
    assert set(body) <= {t for c in full for t in c["input_ids"][1:-1]} and len(body) > 0.8 * sum(
        len(c["input_ids"]) - 2 for c in full
    )
    neutral = [sum(r["group_ids"] == -1 for r in x) for x in (full_rows, short_rows)]
    assert neutral[0] == neutral[1] > 0  # the epoch keeps its number of neutral rows
    with pytest.raises(ValueError, match="neutral_max_length=200 must be between 10 .* and max_length=48"):
        InjectionDataModule(data_dir=str(tmp_path / "data"), max_length=48, neutral_max_length=200)


def test_neutral_text_held_to_theta_pre_is_masked_to_groups_and_targets_theta_pre(tiny_dir, tmp_path):
    from lightning_unlearn.losses import sequence_kl
    from lightning_unlearn.models import load_causal_lm

    pre_model = load_causal_lm(str(tiny_dir)).eval()
    kw = dict(neutral_fraction=0.4, neutral_target="pre", groups=[1, 4], weight_decay=0.0, freeze_outside_masks=True)
    module, data = injection(tiny_dir, tmp_path / "data", **kw)
    data.trainer = make_trainer(tmp_path / "rows")
    data.trainer.strategy.connect(module)
    data.prepare_data()
    data.setup("fit")
    held = [r for r in data.rows if r["held"]]
    # the neutral rows, each under one of the selected groups in turn; the PII rows keep their own groups
    assert [r["group_ids"] for r in held] == [(1, 4)[i % 2] for i in range(len(held))]
    assert {r["group_ids"] for r in data.rows if not r["held"]} == {1, 4} and len(held) > 4

    seen = []  # per step: held rows, the batch's θ_pre log-probs vs a fresh θ_pre's, and the step's loss parts
    loss = module._loss

    def recording_loss(batch):
        rows = batch["held"].bool()
        if rows.any():
            with torch.no_grad():
                fresh = pre_model(input_ids=batch["input_ids"][rows], attention_mask=batch["attention_mask"][rows])
                gap = (batch["pre_logprobs"][rows] - fresh.logits.log_softmax(-1)).abs().max().item()
                policy = module(batch["input_ids"], batch["attention_mask"])[rows]  # the whole batch: it is masked
                kl = sequence_kl(policy, fresh.logits, batch["labels"][rows]).sum().item()
            seen.append((int(rows.sum()), gap, kl))
        return loss(batch)

    module._loss = recording_loss
    make_trainer(tmp_path / "run", max_steps=6).fit(module, data)
    assert sum(n for n, _, _ in seen) > 2
    assert max(gap for _, gap, _ in seen) < 1e-5  # the swapped-back model is θ_pre, after the weights moved
    assert max(kl for _, _, kl in seen) > 0  # and the trained model drifted from it: the KL term had work to do
    export = tmp_path / "run" / "export"
    assert locality_report(str(export), [1, 4])["changed_outside"] == 0
    assert locality_report(str(export), [1, 4])["changed_inside"] > 100

    from lightning_unlearn.models import load_weights

    def trained(name, strategy=True, **extra):
        module, data = injection(tiny_dir, tmp_path / "data", **kw, **extra)
        make_trainer(tmp_path / name, max_steps=6, strategy=strategy).fit(module, data)
        return load_weights(tmp_path / name / "export" / "inj")

    # a pass per group (lockstep: sub-batches of the rows and their θ_pre log-probs) trains the same weights
    one_pass = load_weights(export / "inj")
    lockstep = trained("lockstep", MaskedSingleDeviceStrategy(masking="lockstep"))
    assert max((one_pass[n] - lockstep[n]).abs().max().item() for n in one_pass) < 1e-6
    # the same run without the KL term trains other weights: the term reaches the gradient
    without = trained("run0", neutral_kl_weight=0.0)
    assert max((one_pass[n] - without[n]).abs().max().item() for n in one_pass) > 1e-4

    module, data = injection(tiny_dir, tmp_path / "data", **{**kw, "weight_decay": 0.1, "freeze_outside_masks": False})
    with pytest.raises(ValueError, match="weight_decay 0.1 moves them"):
        make_trainer(tmp_path / "bad", max_steps=1).fit(module, data)
    with pytest.raises(ValueError, match="neutral_target='kl'; use one of text, pre"):
        InjectionDataModule(data_dir=str(tmp_path / "data"), neutral_target="kl")


@pytest.mark.parametrize("masked", [True, False])  # the swap to θ_pre, and the UnMask control's frozen copy
def test_held_rows_theta_pre_logprobs_are_kept_and_the_forward_skipped_after_the_first_epoch(
    tiny_dir, tmp_path, monkeypatch, masked
):
    from lightning_unlearn.models import load_causal_lm

    pre_model = load_causal_lm(str(tiny_dir)).eval()
    kw = dict(neutral_fraction=0.4, neutral_target="pre", groups=[1, 4], weight_decay=0.0, masked=masked)
    forwards = []  # the epoch of each θ_pre forward of held rows
    gaps, epochs, current = [], [], {}

    def run(name, **extra):
        forwards.clear()
        module, data = injection(tiny_dir, tmp_path / "data", **kw, **extra)
        current["module"] = module
        loss = module._loss

        def recording_loss(batch):
            rows = batch["held"].bool()
            if rows.any():
                with torch.no_grad():
                    ids, attention = batch["input_ids"][rows], batch["attention_mask"][rows]
                    fresh = pre_model(input_ids=ids, attention_mask=attention).logits.log_softmax(-1)
                real = attention.bool()  # the cache keeps each row's own positions; padding is never read
                gaps.append((batch["pre_logprobs"][rows][real] - fresh[real]).abs().max().item())
                epochs.append(module.trainer.current_epoch)
            return loss(batch)

        module._loss = recording_loss
        make_trainer(tmp_path / name, max_epochs=2).fit(module, data)
        return module, [forwards.count(e) for e in range(2)]

    def epoch():
        return current["module"].trainer.current_epoch

    if masked:  # each θ_pre forward sets every group back to θ_pre first
        from lightning_unlearn.objectives.group_dropout import GroupDropout

        drop = GroupDropout.drop

        def counting_drop(self, model, groups):
            forwards.append(epoch())
            return drop(self, model, groups)

        monkeypatch.setattr(GroupDropout, "drop", counting_drop)
    else:
        from transformers import LlamaForCausalLM

        forward = LlamaForCausalLM.forward

        def counting_forward(self, *args, **kwargs):
            if self is not pre_model and not self.training and not torch.is_grad_enabled():  # the control's copy
                forwards.append(epoch())
            return forward(self, *args, **kwargs)

        monkeypatch.setattr(LlamaForCausalLM, "forward", counting_forward)
    cached, cached_forwards = run("cached", held_cache_gib=1.0)
    per_epoch = [epochs.count(e) for e in range(2)]
    assert all(n > 0 for n in per_epoch) and cached._held_cache.used > 0
    assert max(gaps) < 1e-5  # every step's targets are θ_pre's, the kept ones included, at each row's positions
    # the held rows are a fixed set: with the cache only the first epoch runs θ_pre, without it every step does
    assert cached_forwards[0] > 0 and cached_forwards[1] == 0
    _, every_step = run("recomputed")
    assert every_step == per_epoch
    _, over_budget = run("over_budget", held_cache_gib=1e-9)  # no row fits: every epoch runs θ_pre again
    assert all(n > 0 for n in over_budget)
    with pytest.raises(ValueError, match="held_cache_gib=-1 must be >= 0"):
        InjectionModule(model_path=str(tiny_dir), held_cache_gib=-1)


def test_unmask_control_holds_neutral_text_to_a_frozen_theta_pre(tiny_dir, tmp_path):
    from lightning_unlearn.models import load_causal_lm, load_weights

    pre_model = load_causal_lm(str(tiny_dir)).eval()
    kw = dict(neutral_fraction=0.4, neutral_target="pre", groups=[1, 4], masked=False, weight_decay=0.01)
    module, data = injection(tiny_dir, tmp_path / "data", **kw)
    gaps, loss = [], module._loss

    def recording_loss(batch):
        rows = batch["held"].bool()
        if rows.any():
            with torch.no_grad():
                fresh = pre_model(input_ids=batch["input_ids"][rows], attention_mask=batch["attention_mask"][rows])
            gaps.append((batch["pre_logprobs"][rows] - fresh.logits.log_softmax(-1)).abs().max().item())
        return loss(batch)

    module._loss = recording_loss
    make_trainer(tmp_path / "run", max_steps=6).fit(module, data)
    assert len(gaps) > 1 and max(gaps) < 1e-5  # θ_pre's distributions after every weight has moved
    assert len(module.state_dict()) == len(module.model.state_dict())  # the frozen copy is not checkpointed
    assert locality_report(str(tmp_path / "run" / "export"), [1, 4])["changed_outside"] > 1000  # masks off
    held = load_weights(tmp_path / "run" / "export" / "inj")
    module, data = injection(tiny_dir, tmp_path / "data", **kw, neutral_kl_weight=0.0)
    make_trainer(tmp_path / "run0", max_steps=6).fit(module, data)
    without = load_weights(tmp_path / "run0" / "export" / "inj")
    assert max((held[n] - without[n]).abs().max().item() for n in held) > 1e-4  # the KL term reaches the weights


def test_other_groups_qa_held_to_theta_pre_under_each_groups_mask(tiny_dir, tmp_path):
    from lightning_unlearn.data.collate import encode_document
    from lightning_unlearn.data.testbed_data import load_table

    kw = dict(neutral_fraction=0.0, hold_other_groups=0.5, groups=[1, 4], weight_decay=0.0, freeze_outside_masks=True,
              one_group_per_batch=True, include_documents=False, drop_other_groups=[[0, 1.0], [4, 0.0]],
              cycles=[[4, 1.0], [4, 0.5]])  # fmt: skip
    module, data = injection(tiny_dir, tmp_path / "data", **kw)
    data.trainer = make_trainer(tmp_path / "rows")
    data.trainer.strategy.connect(module)
    data.prepare_data()
    data.setup("fit")
    tok = load_tokenizer(str(tiny_dir))
    qa = load_table(tmp_path / "data", "qa")
    group_of = {}  # a QA row's tokens -> the groups of the people it is about
    for prompt, answer, g in zip(qa["prompt"], qa["answer"], qa["group_id"]):
        group_of.setdefault(tuple(encode_document(tok, prompt + answer, 48)["input_ids"]), set()).add(g)
    for g in (1, 4):
        own = [r for r in data.rows if r["group_ids"] == g and not r["held"]]
        held = [r for r in data.rows if r["group_ids"] == g and r["held"]]
        assert len(held) == round(0.5 * len(own)) and len(own) > 4
        assert all(g not in group_of[tuple(r["input_ids"])] for r in held)  # other groups' people only
        # a person of the other injected group is marked with it; people of groups not injected are not
        other = 5 - g  # 1 <-> 4
        assert {r["other_group"] for r in held} == {-1, other}
        assert all((r["other_group"] == other) == (other in group_of[tuple(r["input_ids"])]) for r in held)
        assert len({tuple(r["input_ids"]) for r in held}) == len(held)  # no row twice while the pool lasts
        assert all(group_of[tuple(r["input_ids"])] == {g} for r in own)

    seen = []  # per step: the batch's group, its held rows, and whether the other groups' elements were at θ_pre
    counted = []  # per step: whether a held row was left out (its group's change present)
    loss = module._loss

    def recording_loss(batch):
        from lightning_unlearn.masks import canonical_name, group_mask
        from lightning_unlearn.models import load_weights

        (g,) = set(batch["group_ids"].tolist())
        weights = load_weights(tiny_dir)
        params = {canonical_name(n): q.detach() for n, q in module.model.named_parameters()}
        other = [h for h in (1, 4) if h != g]
        at_pre = all(torch.equal(params[n][m], weights[n][m]) for n, b in module.packed_masks.items()
                     for m in [group_mask(b, other)] if m.any())  # fmt: skip
        seen.append((g, int(batch["held"].sum()), at_pre))
        # a held row about the other injected group's people counts only while that group is at θ_pre (its target)
        live = batch["other_group"] == other[0]
        assert torch.equal(batch["counted"], ~live | at_pre), (batch["counted"], live, at_pre)
        counted.append(bool((live & ~batch["counted"]).any()))
        return loss(batch)

    module._loss = recording_loss
    make_trainer(tmp_path / "run", max_epochs=3, max_steps=8).fit(module, data)
    assert sum(n for _, n, _ in seen) > 2
    assert all(at for _, _, at in seen[:4])  # [0, 1.0]: each group trained with the other at θ_pre
    assert not all(at for _, _, at in seen[5:])  # [4, 0.0]: then with the other's change present
    assert not any(counted[:4]) and any(counted[4:])  # so only then are some held rows left out
    assert locality_report(str(tmp_path / "run" / "export"), [1, 4])["changed_outside"] == 0

    module, data = injection(tiny_dir, tmp_path / "data", **{**kw, "masked": False, "freeze_outside_masks": False,
                                                              "drop_other_groups": 0.0})  # fmt: skip
    with pytest.raises(ValueError, match="hold_other_groups holds other groups' QA to θ_pre .* UnMask control"):
        make_trainer(tmp_path / "bad", max_steps=1).fit(module, data)
    module, data = injection(tiny_dir, tmp_path / "data", **{**kw, "drop_other_groups": 0.0, "cycles": None})
    with pytest.raises(ValueError, match="injected people would never count. Set model.init_args.drop_other_groups"):
        make_trainer(tmp_path / "bad2", max_steps=1).fit(module, data)
    module, data = injection(tiny_dir, tmp_path / "data", **{**kw, "num_groups": 3})
    with pytest.raises(ValueError, match="has 6 groups, but the module samples masks for num_groups=3; set model"):
        make_trainer(tmp_path / "bad3", max_steps=1).fit(module, data)
    with pytest.raises(ValueError, match="neutral_fraction 1 injects no group"):
        InjectionDataModule(data_dir=str(tmp_path / "data"), neutral_fraction=1.0, hold_other_groups=0.25)
    with pytest.raises(ValueError, match="hold_other_groups=-1"):
        InjectionDataModule(data_dir=str(tmp_path / "data"), hold_other_groups=-1)
    for bad in ([[1, 1.0]], [[0, 1.0], [0, 0.5]], [[0, 1.5]], "half"):
        with pytest.raises(ValueError, match="drop_other_groups="):
            InjectionModule(model_path=str(tiny_dir), drop_other_groups=bad)


def test_filter_measures_only_the_given_groups(tiny_dir, tmp_path):
    from lightning_unlearn.data.testbed_data import build_testbed_data, load_table

    build_testbed_data(tmp_path / "data", small_data(), log=lambda *_: None)
    profiles = list(load_table(tmp_path / "data", "profiles"))
    lacuna_main(["filter", "--model", str(tiny_dir), "--data", str(tmp_path / "data"), "--out",
                 str(tmp_path / "f"), "--groups", "[2, 4]"])  # fmt: skip
    report = json.loads((tmp_path / "f" / "extraction.json").read_text())
    assert report["groups"] == [2, 4]
    assert report["profiles"] == sum(not p["instruct"] and p["group_id"] in (2, 4) for p in profiles) > 0
    with pytest.raises(ValueError, match=r"groups \[9\] have no profile"):
        lacuna_main(["filter", "--model", str(tiny_dir), "--data", str(tmp_path / "data"), "--out",
                     str(tmp_path / "g"), "--groups", "[9]"])  # fmt: skip
    assert not (tmp_path / "g").exists()


def test_filter_writes_truth_ratio_columns_and_the_membership_splits(tiny_dir, tmp_path, monkeypatch):
    """The splits feed TOFUEvaluation and MIAEvaluation as written (a random tiny model memorizes nothing, so the
    extraction is stubbed: everyone memorized)."""
    import lightning_unlearn.workflows.lacuna.filter as lacuna_filter
    from lightning_unlearn.callbacks import MIAEvaluation, TOFUEvaluation
    from lightning_unlearn.data.templates import TARGET_FIELDS
    from lightning_unlearn.data.testbed_data import build_testbed_data, load_holdout_profiles, load_table

    data = build_testbed_data(tmp_path / "data", small_data(num_profiles=24, holdout_per_group=2), log=lambda *_: None)
    everyone = {p["profile_id"] for p in load_table(data, "profiles") if not p["instruct"]}
    monkeypatch.setattr(lacuna_filter, "extraction_rates", lambda m, t, p: ({}, {f: everyone for f in TARGET_FIELDS}))
    report = lacuna_filter.filter_stage(str(tiny_dir), str(data), str(tmp_path / "splits"))
    splits = tmp_path / "splits"
    # tiny: 24 people, one evaluation profile in each of the three forget groups, two held-out people a group
    assert report["split_sizes"]["mia/members"] == 3 * 4 and report["split_sizes"]["mia/nonmembers"] == 3 * 2 * 4
    held = {p["profile_id"] for p in load_holdout_profiles(data)}
    mia = MIAEvaluation(str(splits / "mia" / "members"), str(splits / "mia" / "nonmembers"), privleak=False)
    assert {r["profile_id"] for r in mia.sets["nonmembers"]} <= held
    assert not {r["profile_id"] for r in mia.sets["members"]} & held
    tofu = TOFUEvaluation({s: str(splits / "email" / s) for s in ("forget", "retain")}, forget_quality=False)
    assert all(len(r["perturbed_answer"]) == 4 for r in tofu.splits["forget"] + tofu.splits["retain"])


def test_two_group_testbed_splits_forget_group_0_and_retain_group_1(tiny_dir, tmp_path, monkeypatch):
    """The forget and retain groups come from the data (the first half of its groups forget): a two-group testbed
    forgets group 0 and retains group 1; six groups keep the paper's 0-2 / 3-5."""
    import lightning_unlearn.workflows.lacuna.filter as lacuna_filter
    from lightning_unlearn.data.records import read_records
    from lightning_unlearn.data.templates import TARGET_FIELDS
    from lightning_unlearn.data.testbed_data import build_testbed_data, forget_retain_groups, load_table
    from lightning_unlearn.workflows.lacuna.chain import format_split_sizes

    assert forget_retain_groups(6) == ((0, 1, 2), (3, 4, 5)) and forget_retain_groups(2) == ((0,), (1,))
    with pytest.raises(ValueError, match="at least two"):
        forget_retain_groups(1)
    data = build_testbed_data(tmp_path / "data", small_data(num_profiles=16, num_groups=2), log=lambda *_: None)
    everyone = {p["profile_id"] for p in load_table(data, "profiles") if not p["instruct"]}
    monkeypatch.setattr(lacuna_filter, "extraction_rates", lambda m, t, p: ({}, {f: everyone for f in TARGET_FIELDS}))
    report = lacuna_filter.filter_stage(str(tiny_dir), str(data), str(tmp_path / "splits"))
    forget = read_records(str(tmp_path / "splits" / "email" / "forget"))
    retain = read_records(str(tmp_path / "splits" / "email" / "retain"))
    assert forget and retain
    assert {r["group_id"] for r in forget} == {0} and {r["group_id"] for r in retain} == {1}
    assert "forget: groups 0, retain: groups 1," in format_split_sizes(report["split_sizes"], (0,), (1,))


def test_loaded_models_train_in_train_mode(tiny_dir):
    # from_pretrained returns eval mode and Lightning keeps submodule modes, so dropout would silently stay off.
    for module in (InjectionModule(model_path=str(tiny_dir)), InstructionModule(model_path=str(tiny_dir))):
        module.configure_model()
        in_eval = [n for n, m in module.model.named_modules() if not m.training]
        assert not in_eval, f"{type(module).__name__}: {in_eval[:3]}"


def test_instruction_lora_last_two_blocks_keeps_best(tiny_dir, tmp_path):
    from lightning_unlearn.data.testbed_data import build_testbed_data

    build_testbed_data(tmp_path / "data", small_data(), log=lambda *_: None)
    module = InstructionModule(model_path=str(tiny_dir), optim=OptimizerConfig(lr=5e-3))
    module.configure_model()
    trained = {n for n, p in module.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n and (".layers.2." in n or ".layers.3." in n) for n in trained)
    data = InstructionDataModule(data_dir=str(tmp_path / "data"), batch_size=4, max_length=48)
    trainer = make_trainer(tmp_path / "run", max_epochs=2, strategy=False)
    trainer.val_check_interval = 2
    trainer.fit(module, data)
    assert len(data.val_rows) == round(0.3 * (len(data.val_rows) + len(data.train_rows)))
    run = json.loads((tmp_path / "run" / "export" / "run.json").read_text())
    assert run["best_val_loss"] == module.best_val_loss < float("inf")
    # every validation is recorded as [step, loss] (every 2 batches of each epoch); the kept adapter is their minimum
    steps = [s for s, _ in run["val_losses"]]
    assert len(steps) >= 4 and steps == sorted(set(steps)) and steps[0] == 2
    assert [run["best_step"], run["best_val_loss"]] == min(run["val_losses"], key=lambda r: r[1])
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "export" / "model", local_files_only=True)
    base = load_file(str(Path(tiny_dir) / "model.safetensors"))
    changed = {k for k, v in merged.state_dict().items() if k in base and not torch.equal(v, base[k])}
    assert changed and all(".layers.2." in k or ".layers.3." in k for k in changed)


def test_instruction_keeps_the_untrained_model_when_training_only_hurts(tiny_dir, tmp_path):
    from lightning_unlearn.data.testbed_data import build_testbed_data

    build_testbed_data(tmp_path / "data", small_data(), log=lambda *_: None)

    def data():
        return InstructionDataModule(data_dir=str(tmp_path / "data"), batch_size=4, max_length=48)

    def fit(model_path, root, lr, epochs):
        module = InstructionModule(model_path=str(model_path), optim=OptimizerConfig(lr=lr), validate_untrained=True)
        trainer = make_trainer(root, max_epochs=epochs, strategy=False)
        trainer.val_check_interval = 2
        trainer.fit(module, data())
        return module, json.loads((root / "export" / "run.json").read_text())

    def validated(model_path):
        module = InstructionModule(model_path=str(model_path))
        return make_trainer(tmp_path / "v", strategy=False).validate(module, data(), verbose=False)[0]["val/loss"]

    # from the random tiny model, an ordinary learning rate beats the untrained model: a trained adapter is kept
    module, run = fit(tiny_dir, tmp_path / "tuned", 5e-3, 3)
    assert run["best_step"] > 0 and run["best_val_loss"] < validated(tiny_dir)

    # from that tuned model, lr 3 only wrecks the adapter: the untrained model is kept, unchanged
    tuned = tmp_path / "tuned" / "export" / "model"
    module, run = fit(tuned, tmp_path / "wrecked", 3.0, 1)
    assert run["best_step"] == 0 and run["best_val_loss"] == pytest.approx(validated(tuned), rel=1e-5)
    assert run["val_losses"][0] == [0, run["best_val_loss"]] and len(run["val_losses"]) > 1
    merged = load_file(str(tmp_path / "wrecked" / "export" / "model" / "model.safetensors"))
    base = load_file(str(tuned / "model.safetensors"))
    assert merged.keys() == base.keys() and all(torch.equal(merged[k], base[k]) for k in base)


def test_instruction_split_by_profiles_holds_out_whole_people(tiny_dir, tmp_path):
    from datasets import load_from_disk

    from lightning_unlearn.data.testbed_data import build_testbed_data

    build_testbed_data(tmp_path / "data", small_data(num_profiles=24), log=lambda *_: None)
    qa = load_from_disk(str(tmp_path / "data" / "instruct_qa"))
    people = sorted(set(qa["profile_id"]))
    tokenizer = load_tokenizer(str(tiny_dir))

    def prompts(rows):
        return {tokenizer.decode([t for t, lab in zip(r["input_ids"], r["labels"]) if lab == -100]) for r in rows}

    profiles = load_from_disk(str(tmp_path / "data" / "profiles"))

    def names(pids):
        return {f"{p['first_name']} {p['last_name']}" for p in profiles if p["profile_id"] in pids}

    by_rows = InstructionDataModule(data_dir=str(tmp_path / "data"), tokenizer_dir=str(tiny_dir), max_length=64)
    by_people = InstructionDataModule(
        data_dir=str(tmp_path / "data"), tokenizer_dir=str(tiny_dir), max_length=64, split_by="profiles"
    )
    by_rows.setup("fit")
    by_people.setup("fit")
    assert by_rows.val_profile_ids is None
    held_out = set(by_people.val_profile_ids)
    assert len(held_out) == round(0.3 * len(people)) and 0 < len(held_out) < len(people)
    assert len(by_people.val_rows) == sum(pid in held_out for pid in qa["profile_id"])
    assert len(by_people.val_rows) + len(by_people.train_rows) == len(qa)
    # every validation prompt is about a held-out person and no training prompt is
    val_prompts, train_prompts = prompts(by_people.val_rows), prompts(by_people.train_rows)
    assert val_prompts and all(any(n in v for n in names(held_out)) for v in val_prompts)
    assert train_prompts and not any(any(n in t for n in names(held_out)) for t in train_prompts)
    # a row split puts every instruction person in both train and validation
    row_val, row_train = prompts(by_rows.val_rows), prompts(by_rows.train_rows)
    for name in names(set(people)):
        assert any(name in v for v in row_val) and any(name in t for t in row_train)
    assert len(by_rows.val_rows) == round(0.3 * len(qa))

    with pytest.raises(ValueError, match="split_by='shuffle' is not"):
        InstructionDataModule(data_dir=str(tmp_path / "data"), split_by="shuffle")
    one = tmp_path / "one"
    qa.filter(lambda r: r["profile_id"] == people[0]).save_to_disk(str(one))
    lone = InstructionDataModule(source=str(one), tokenizer_dir=str(tiny_dir), split_by="profiles")
    with pytest.raises(ValueError, match="cannot split 1 profiles"):
        lone.setup("fit")


@pytest.mark.parametrize("name", ["pretrain", "pretrain_tiny", "inject", "inject_unmasked", "instruct"])
def test_shipped_configs_parse(name):
    from lightning_unlearn.cli import UnlearnCLI

    cli = UnlearnCLI(args=["-c", str(CONFIGS / f"{name}.yaml")], run=False)
    assert cli.model.__class__.__name__ in ("InjectionModule", "InstructionModule")
    if name.startswith("pretrain"):
        assert cli.model.pretraining and (cli.model.derive is None) == (name == "pretrain_tiny")
    if name.startswith("inject"):
        assert cli.model.hparams.masked is (name == "inject")
        assert cli.model.hparams.coverage == 0.05


class _LrLog(Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_linear_schedule_decays_to_zero_at_the_last_step(tiny_dir, tmp_path):
    log = _LrLog()
    module, data = injection(tiny_dir, tmp_path / "data", warmup_steps=2, schedule="linear")
    make_trainer(tmp_path / "run", max_steps=6, callbacks=[log]).fit(module, data)
    # warm-up 1/2, 2/2 of lr 1e-2, then 1 - (s - 2) / 4 for s = 2..5
    assert log.lrs == pytest.approx([5e-3, 1e-2, 1e-2, 7.5e-3, 5e-3, 2.5e-3])


def test_wsd_schedule_holds_then_decays_over_the_last_fraction(tiny_dir, tmp_path):
    log = _LrLog()
    module, data = injection(tiny_dir, tmp_path / "data", warmup_steps=2, schedule="wsd", decay_fraction=0.3)
    make_trainer(tmp_path / "run", max_steps=10, callbacks=[log]).fit(module, data)
    # warm-up 1/2, 2/2 of lr 1e-2, hold, then (10 - s) / 3 over the last 3 of 10 steps: s = 8, 9 → 2/3, 1/3
    assert log.lrs == pytest.approx([5e-3] + [1e-2] * 7 + [1e-2 * 2 / 3, 1e-2 / 3])
    with pytest.raises(ValueError, match=r"decay_fraction must be in \(0, 1\], got 0"):
        InjectionModule(model_path=str(tiny_dir), optim=OptimizerConfig(schedule="wsd", decay_fraction=0.0))


def test_fused_adamw_takes_the_same_step_as_the_loop_to_rounding():
    torch.manual_seed(0)
    loop_params = [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(3))]
    fused_params = [torch.nn.Parameter(p.detach().clone()) for p in loop_params]
    loop = OptimizerConfig(lr=1e-2, weight_decay=0.1).configure(loop_params, 3)["optimizer"]
    fused = OptimizerConfig(lr=1e-2, weight_decay=0.1, fused=True).configure(fused_params, 3)["optimizer"]
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    start = loop_params[0].detach().clone()
    for _ in range(3):
        grads = [torch.randn_like(p) for p in loop_params]
        for params in (loop_params, fused_params):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
        loop.step()
        fused.step()
    assert not torch.equal(loop_params[0], start)
    for a, b in zip(loop_params, fused_params, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


def test_unknown_schedule_is_refused(tiny_dir):
    with pytest.raises(ValueError, match="schedule='cosine' is not one of"):
        InjectionModule(model_path=str(tiny_dir), optim={"schedule": "cosine"})


def test_epoch_seeded_sampler_splits_one_permutation_over_ranks():
    from lightning_unlearn.data.sampling import EpochSeededSampler

    one = EpochSeededSampler(10, seed=3)
    one.set_epoch(2)
    order = list(one)
    assert sorted(order) == list(range(10))
    ranks = []
    for r in range(3):
        s = EpochSeededSampler(10, seed=3, num_replicas=3, rank=r)
        s.set_epoch(2)
        ranks.append(list(s))
    assert [len(x) for x in ranks] == [4, 4, 4]
    # the ranks' i-th samples are the permutation's i-th slice of 3 (padded with its head at the end)
    interleaved = [x[i] for i in range(4) for x in ranks]
    assert interleaved == order + order[:2]
    one.set_epoch(3)
    assert list(one) != order  # a new epoch, a new order
    with pytest.raises(ValueError, match="rank 3 is not in"):
        EpochSeededSampler(10, num_replicas=3, rank=3)


def test_epoch_seeded_sampler_groups_batches_by_length_and_keeps_ranks_on_one_global_batch():
    from lightning_unlearn.data.sampling import EpochSeededSampler

    lengths = torch.randint(5, 90, (40,), generator=torch.Generator().manual_seed(1)).tolist()

    def batches(order, size):
        return [order[k : k + size] for k in range(0, len(order), size)]

    def padded(order, size):  # tokens computed when each batch pads to its longest sample
        return sum(len(b) * max(lengths[i] for i in b) for b in batches(order, size))

    # one run of the whole epoch: every batch is a contiguous stretch of the sorted lengths
    whole = EpochSeededSampler(40, seed=5, lengths=lengths, batch_size=8, group_batches=5)
    order = list(whole)
    assert sorted(order) == list(range(40))
    for b in batches(order, 8):
        lo, hi = min(lengths[i] for i in b), max(lengths[i] for i in b)
        assert not [i for i in range(40) if i not in b and lo < lengths[i] < hi]
    plain = EpochSeededSampler(40, seed=5)
    assert padded(order, 8) < 0.8 * padded(list(plain), 8)
    assert [lengths[b[0]] for b in batches(order, 8)] != sorted(lengths[b[0]] for b in batches(order, 8))

    # runs of 2 global batches over 2 ranks of batch 4: rank r's k-th batch is its share of global batch k
    one = EpochSeededSampler(40, seed=5, lengths=lengths, batch_size=8, group_batches=2)
    ranks = [EpochSeededSampler(40, seed=5, num_replicas=2, rank=r, lengths=lengths, batch_size=4, group_batches=2)
             for r in range(2)]  # fmt: skip
    per_rank = [batches(list(s), 4) for s in ranks]
    for k, global_batch in enumerate(batches(list(one), 8)):
        assert sorted(per_rank[0][k] + per_rank[1][k]) == sorted(global_batch)
    assert list(one) == list(EpochSeededSampler(40, seed=5, lengths=lengths, batch_size=8, group_batches=2))
    with pytest.raises(ValueError, match="needs the length of each sample"):
        EpochSeededSampler(40, group_batches=2)


def test_epoch_seeded_sampler_puts_one_key_in_each_global_batch():
    from lightning_unlearn.data.sampling import EpochSeededSampler

    keys = [0] * 11 + [1] * 8 + [2] * 3 + [-1] * 6  # groups of 11, 8 and 3 samples and 6 neutral ones
    one = EpochSeededSampler(28, seed=2, batch_size=4, batch_keys=keys)
    one.set_epoch(1)
    order = list(one)
    # 3 + 2 + 1 + 2 batches of 4; a key's last batch is filled with its own samples
    assert len(order) == len(one) == 32
    batches = [order[k : k + 4] for k in range(0, 32, 4)]
    assert all(len({keys[i] for i in b}) == 1 for b in batches)
    assert sorted(set(order)) == list(range(28))
    assert sorted(keys[b[0]] for b in batches) == [-1, -1, 0, 0, 0, 1, 1, 2]
    assert [keys[b[0]] for b in batches] != sorted(keys[b[0]] for b in batches)  # the batches are shuffled
    one.set_epoch(2)
    assert list(one) != order
    # two ranks of batch 2 take their shares of the same one-key global batches
    ranks = [EpochSeededSampler(28, seed=2, batch_size=2, num_replicas=2, rank=r, batch_keys=keys) for r in range(2)]
    for s in ranks:
        s.set_epoch(1)
    per_rank = [list(s) for s in ranks]
    assert [sorted(per_rank[0][k : k + 2] + per_rank[1][k : k + 2]) for k in range(0, 16, 2)] == [
        sorted(b) for b in batches
    ]
    with pytest.raises(ValueError, match="batch_keys has 3 keys for 28 samples"):
        EpochSeededSampler(28, batch_keys=[0, 1, 2])


def test_pretraining_from_a_derived_model(tiny_dir, tmp_path):
    from lightning_unlearn.derive import DeriveConfig, ensure_derived
    from lightning_unlearn.models import load_causal_lm

    derive = DeriveConfig(source=str(tiny_dir), blocks=2, path=str(tmp_path / "base"))
    module = InjectionModule(derive=derive, masked=False, optim=OptimizerConfig(lr=1e-3))
    data = InjectionDataModule(
        data_dir=str(tmp_path / "data"), data=small_data(), neutral_fraction=1.0, background_profiles=3,
        max_length=48, batch_size=4, group_by_length=2,
    )  # fmt: skip
    make_trainer(tmp_path / "run", max_steps=3, strategy=False).fit(module, data)
    model = load_causal_lm(tmp_path / "run" / "export" / "model")
    tok, source_tok = load_tokenizer(tmp_path / "run" / "export" / "model"), load_tokenizer(tiny_dir)
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tok) < len(source_tok)
    # every text a later stage reads (a probe here) keeps its tokens; only their ids change
    probe = f"Question: {data.vocabulary_corpus()[-1]}"
    assert tok.convert_ids_to_tokens(tok(probe)["input_ids"]) == source_tok.convert_ids_to_tokens(
        source_tok(probe)["input_ids"])  # fmt: skip
    derived = load_causal_lm(tmp_path / "base")  # what training started from, before the 3 steps
    assert derived.config.num_hidden_layers == 2
    assert not torch.equal(derived.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight)

    # the derived model is reused only for the same source, blocks and corpus
    corpus = data.vocabulary_corpus
    assert ensure_derived(derive, corpus, log=lambda m: None) == tmp_path / "base"
    with pytest.raises(ValueError, match="was made from another source, block list or corpus"):
        ensure_derived(DeriveConfig(source=str(tiny_dir), blocks=3, path=derive.path), corpus, log=lambda m: None)
    with pytest.raises(ValueError, match="give one of model_path .* not model_path and derive"):
        InjectionModule(model_path=str(tiny_dir), derive=derive)


def test_filter_and_memorization_callback_share_one_extraction_rule(monkeypatch):
    """The Lacuna filter and MemorizationEvaluation (its ExtractionRate) call the same `extracted`: an answer that
    differs from the PII string only by case and spacing is memorized for both."""
    import lightning_unlearn.callbacks.memorization_evaluation as callback
    import lightning_unlearn.workflows.lacuna.extraction as lacuna
    import lightning_unlearn.workflows.lacuna.filter as lacuna_filter
    from lightning_unlearn.metrics.memorization import ExtractionRate, extracted

    assert lacuna_filter.extraction_rates is lacuna.extraction_rates
    assert lacuna.extracted is extracted and callback.ExtractionRate is ExtractionRate  # which counts by `extracted`
    profile = {"profile_id": 7, "email": "Ada.Lovelace@example.org"}
    answer = "Her email is  ada.lovelace@EXAMPLE.org."
    monkeypatch.setattr(lacuna, "probe_qa", lambda p, field: {"prompt": "What is the email?"})
    monkeypatch.setattr(lacuna, "generate", lambda model, tok, prompts, **kw: [[answer] for _ in prompts])
    rates, memorized = lacuna.extraction_rates(None, None, [profile], fields=["email"])
    assert rates == {"email": 1.0} and memorized == {"email": {7}}
    assert extracted([answer], [profile["email"]]) == [True]
    rate = ExtractionRate()
    rate.update([answer], [profile["email"]])
    assert float(rate.compute()) == 1.0
