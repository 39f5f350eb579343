"""``--ckpt_path`` loads into the configured model: another model's checkpoint, another adapter kind, a changed
optimizer on resume and a corrupt file are refused with one line; other changed values are applied and logged."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_unlearn.cli import main
from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.models import AdapterConfig
from lightning_unlearn.objectives import NPO, OptimizerConfig

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


@pytest.fixture(scope="module")
def full_ft_checkpoint(testbed, tmp_path_factory):
    """A checkpoint of a full fine-tuning NPO run on the testbed model (step 1)."""
    root = tmp_path_factory.mktemp("ckpt")
    module = NPO(testbed.model_dir, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3))
    # The data settings of lens/npo.yaml with _argv's overrides: a resume through the CLI sees the same data.
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2, max_length=512)
    save = ModelCheckpoint(dirpath=str(root), every_n_train_steps=1, filename="{step}")
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, default_root_dir=str(root),
                      callbacks=[save])  # fmt: skip
    trainer.fit(module, dm)
    return next(root.glob("step=*.ckpt"))


def _argv(command, testbed, ckpt, tmp_path, *extra):
    return [
        command, "-c", "lens/npo.yaml", f"--model.init_args.model_path={testbed.model_dir}",
        f"--data.init_args.tokenizer_path={testbed.model_dir}", f"--data.init_args.forget_path={testbed.forget}",
        f"--data.init_args.retain_path={testbed.retain}", "--data.init_args.batch_size=2", "--trainer.logger=false",
        "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=2",
        f"--ckpt_path={ckpt}", *extra,
    ]  # fmt: skip


def test_validate_with_another_models_checkpoint_is_refused(testbed, full_ft_checkpoint, tmp_path):
    from lightning_unlearn.models import load_causal_lm

    other = tmp_path / "other_model"
    shutil.copytree(testbed.model_dir, other)  # same shapes, other weights
    model = load_causal_lm(other)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    model.save_pretrained(other)
    argv = _argv("validate", testbed, full_ft_checkpoint, tmp_path, "--model.init_args.adapter.kind=full")
    argv[3] = f"--model.init_args.model_path={other}"
    with pytest.raises(SystemExit, match=r"belongs to another model .*model_path: checkpoint") as err:
        main(argv)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "config.yaml").exists()  # nothing written before the check


def test_a_moved_copy_of_the_same_model_is_the_same_model(testbed, full_ft_checkpoint, tmp_path, caplog):
    moved = tmp_path / "moved_model"
    shutil.copytree(testbed.model_dir, moved)  # the same weights at another path
    argv = _argv("validate", testbed, full_ft_checkpoint, tmp_path / "run", "--model.init_args.adapter.kind=full")
    argv[3] = f"--model.init_args.model_path={moved}"
    with caplog.at_level(logging.INFO, logger="lightning_unlearn"):
        main(argv)
    assert any("the starting model moved (same weights): model_path" in r.getMessage() for r in caplog.records)


def test_full_ft_checkpoint_under_a_lora_config_is_refused(testbed, full_ft_checkpoint, tmp_path):
    with pytest.raises(SystemExit, match=r"another model .*adapter: checkpoint \{.*'kind': 'full'"):
        main(_argv("validate", testbed, full_ft_checkpoint, tmp_path))  # lens/npo.yaml: LoRA


def test_resume_with_another_learning_rate_is_refused(testbed, full_ft_checkpoint, tmp_path):
    argv = _argv("fit", testbed, full_ft_checkpoint, tmp_path, "--model.init_args.adapter.kind=full",
                 "--model.init_args.optim.lr=5e-4")  # fmt: skip
    with pytest.raises(SystemExit, match=r"optim: checkpoint .*'lr': 0.001"):
        main(argv)


def test_resume_with_another_beta_is_applied_and_logged(testbed, full_ft_checkpoint, tmp_path, caplog):
    argv = _argv("fit", testbed, full_ft_checkpoint, tmp_path, "--model.init_args.adapter.kind=full",
                 "--model.init_args.optim.lr=0.001", "--model.init_args.beta=0.5")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="lightning_unlearn"):
        main(argv)
    assert any("changed value: beta: checkpoint 0.1 → configured 0.5" in r.getMessage() for r in caplog.records)
    saved = (tmp_path / "config.yaml").read_text()
    assert "beta: 0.5" in saved  # the configured value is the run's, not the checkpoint's


@pytest.mark.parametrize("change", ["forget file", "seed"])
def test_a_resume_on_changed_data_is_refused_in_one_line(testbed, full_ft_checkpoint, tmp_path, change):
    run = tmp_path / "run"
    argv = _argv("fit", testbed, full_ft_checkpoint, run, "--model.init_args.adapter.kind=full",
                 "--model.init_args.optim.lr=0.001")  # fmt: skip
    if change == "forget file":  # same path as the checkpoint's, other bytes
        forget = tmp_path / "forget.jsonl"
        shutil.copy(testbed.forget, forget)
        ckpt = tmp_path / "step=1.ckpt"
        import torch

        state = torch.load(full_ft_checkpoint, map_location="cpu", weights_only=True)
        state["ForgetRetainDataModule"]["data_fingerprint"]["forget_path"] = str(forget)
        torch.save(state, ckpt)
        lines = forget.read_text().splitlines()
        forget.write_text("\n".join(lines[1:]) + "\n")  # one forget pair fewer
        argv = [a.replace(str(testbed.forget), str(forget)).replace(str(full_ft_checkpoint), str(ckpt)) for a in argv]
        want = rf"the content of forget_path \({forget}\) changed since the checkpoint"
    else:
        argv.append("--data.init_args.seed=1")
        want = r"seed: checkpoint 0 → configured 1"
    with pytest.raises(SystemExit, match=rf"was trained on other data: {want}; .*--allow_data_change true") as err:
        main(argv)
    assert "\n" not in str(err.value)
    assert not run.exists()  # nothing written before the check


def test_a_resume_on_changed_data_is_allowed_and_recorded_with_the_flag(testbed, full_ft_checkpoint, tmp_path, caplog):
    import torch

    run = tmp_path / "run"
    argv = _argv("fit", testbed, full_ft_checkpoint, run, "--model.init_args.adapter.kind=full",
                 "--model.init_args.optim.lr=0.001", "--data.init_args.seed=1", "--allow_data_change=true",
                 "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.dirpath=" + str(run / "ckpt"),
                 "--trainer.callbacks.every_n_train_steps=1")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="lightning_unlearn"):
        main(argv)
    assert any("resuming" in r.getMessage() and "seed: checkpoint 0 → configured 1" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert "allow_data_change: true" in (run / "config.yaml").read_text()
    (saved,) = (run / "ckpt").glob("*.ckpt")
    state = torch.load(saved, map_location="cpu", weights_only=True)["ForgetRetainDataModule"]["data_fingerprint"]
    assert state["seed"] == 1 and state["changes"] == ["seed: checkpoint 0 → configured 1"]


def test_a_truncated_checkpoint_is_named_corrupt(testbed, full_ft_checkpoint, tmp_path):
    good = tmp_path / "step=1.ckpt"
    shutil.copy(full_ft_checkpoint, good)
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(good.read_bytes()[:1000])
    with pytest.raises(SystemExit, match=r"last.ckpt' is corrupt or not a Lightning checkpoint.*step=1.ckpt"):
        main(_argv("fit", testbed, bad, tmp_path, "--model.init_args.adapter.kind=full"))


def test_ckpt_path_last_finds_the_runs_checkpoint_in_any_version_or_refuses(testbed, full_ft_checkpoint, tmp_path,
                                                                             caplog):  # fmt: skip
    from lightning_unlearn.checkpoints import latest_checkpoint

    argv = _argv("fit", testbed, "last", tmp_path, "--model.init_args.adapter.kind=full",
                 "--model.init_args.optim.lr=0.001")  # fmt: skip
    with pytest.raises(SystemExit, match="holds no checkpoint to resume from"):
        main(argv)  # nothing to resume: refused, not a silent restart from step 0
    nested = tmp_path / "npo" / "version_3" / "checkpoints"
    nested.mkdir(parents=True)
    shutil.copy(full_ft_checkpoint, nested / "step=1.ckpt")
    (nested / "last.ckpt").write_bytes(b"truncated")
    with caplog.at_level(logging.INFO, logger="lightning_unlearn"):
        assert latest_checkpoint(tmp_path) == nested / "step=1.ckpt"  # the corrupt last.ckpt is skipped, named
        main(argv)
    assert any("last.ckpt: corrupt" in r.getMessage() for r in caplog.records)
    assert any(r.getMessage() == f"resuming from {nested / 'step=1.ckpt'}" for r in caplog.records)


def test_a_second_run_in_the_same_directory_is_refused(testbed, tmp_path):
    import json
    import socket
    import subprocess
    import sys

    from lightning_unlearn.checkpoints import LOCK_FILE

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the "first run"
    try:
        lock = tmp_path / LOCK_FILE
        lock.write_text(json.dumps({"pid": other.pid, "host": socket.gethostname()}))
        argv = _argv("fit", testbed, "null", tmp_path)[:-1]  # no --ckpt_path
        with pytest.raises(SystemExit, match=rf"is in use by another run \(pid {other.pid} "):
            main(argv)
        assert not (tmp_path / "config.yaml").exists()
    finally:
        other.kill()
        other.wait()
    main(argv)  # the holder is gone: its lock is stale, replaced, and released when this run ends
    assert not lock.exists() and (tmp_path / "config.yaml").exists()


# -- inputs that used to be accepted silently: one line, and nothing written ------------------------------------------
def _fit_argv(testbed, tmp_path, *extra):
    return _argv("fit", testbed, "null", tmp_path, *extra)[:-1]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--trainer.max_steps=0"], r"trainer.max_steps=0 trains nothing"),
        (["--model.init_args.optim.lr=-1"], r"fit: error: optim.lr must be a positive finite number, got -1.0; "),
    ],
    ids=["max_steps-0", "negative-lr"],
)
def test_bad_values_are_one_line_errors(testbed, tmp_path, extra, message):
    with pytest.raises(SystemExit, match=message) as err:
        main([*_fit_argv(testbed, tmp_path), *extra])
    assert "\n" not in str(err.value)
    assert not any(tmp_path.iterdir())  # no config.yaml, no log directory, no lock left


def test_validate_with_the_validation_loop_off_still_evaluates(testbed, full_ft_checkpoint, tmp_path):
    # The SmolLM2 trajectory config turns the loop off during fit (limit_val_batches: 0); validate must still run
    # the evaluation callbacks on the checkpoint instead of exiting 0 with no row.
    import json

    from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows

    memorization = json.dumps([{"class_path": "lightning_unlearn.callbacks.MemorizationEvaluation",
                                "init_args": {"splits": {"forget": testbed.forget}, "max_new_tokens": 4}}])  # fmt: skip
    argv = _argv("validate", testbed, full_ft_checkpoint, tmp_path, "--model.init_args.adapter.kind=full",
                 "--trainer.limit_val_batches=0", f"--trainer.callbacks={memorization}")  # fmt: skip
    main(argv)
    rows = read_rows(next(tmp_path.rglob("checkpoint_metrics.jsonl")))
    assert [(r["step"], r["family"], r["fn"]) for r in rows] == [(1, "memorization", "validate")]


def test_group_ids_outside_the_packing_or_the_forget_groups_are_refused(testbed, tmp_path):
    import json

    from conftest import FORGET

    from lightning_unlearn.data.unlearning import ForgetRetainDataModule
    from lightning_unlearn.objectives import OracleGrad

    def forget_with(group):
        path = tmp_path / f"forget_{group}.jsonl"
        rows = [{**r, "group_id": 0} for r in FORGET]
        rows[2]["group_id"] = group
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    dm = ForgetRetainDataModule(testbed.model_dir, forget_with(40), testbed.retain)
    with pytest.raises(ValueError, match=r"row 2 .* has group_id 40; group ids are -1 \(neutral\) to 31"):
        dm.setup("fit")
    run = tmp_path / "run"
    argv = _fit_argv(testbed, run)
    argv[argv.index(f"--data.init_args.forget_path={testbed.forget}")] = (
        f"--data.init_args.forget_path={forget_with(40)}"
    )
    with pytest.raises(SystemExit, match=r"^lightning-unlearn fit: error: row 2 .* has group_id 40") as err:
        main(argv)  # through the command line: one line, and no checkpoint
    assert "\n" not in str(err.value) and not list(run.rglob("*.ckpt"))
    module = OracleGrad(testbed.model_dir, testbed.masks, AdapterConfig(kind="lora", dropout=0.0))
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, default_root_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ValueError, match=r"forget row 2 has group_id 4, outside forget_groups \[0, 1, 2\]"):
        trainer.fit(module, ForgetRetainDataModule(testbed.model_dir, forget_with(4), testbed.retain))
    with pytest.raises(ValueError, match=r"forget_groups \[7\] have no element in the masks"):
        OracleGrad(testbed.model_dir, testbed.masks, forget_groups=[0, 7])


def test_a_fit_removes_the_temporaries_an_interrupted_write_left(testbed, tmp_path):
    stale_dir = tmp_path / "checkpoints" / ".adapter-step=4.k2j3.tmp"
    stale_dir.mkdir(parents=True)
    (stale_dir / "adapter_model.safetensors").write_bytes(b"half")
    stale_file = tmp_path / ".checkpoint_metrics.jsonl.x81.tmp"
    stale_file.write_text("{")
    kept = tmp_path / "notes.tmp"  # not an atomic writer's temporary (no leading dot): left alone
    kept.write_text("mine")
    main(_fit_argv(testbed, tmp_path, "--trainer.max_steps=1"))
    assert not stale_dir.exists() and not stale_file.exists() and kept.exists()


def test_a_forget_file_moved_with_the_same_bytes_resumes_without_a_word(testbed, full_ft_checkpoint, tmp_path, caplog):
    moved = tmp_path / "elsewhere" / "forget.jsonl"
    moved.parent.mkdir()
    shutil.copy(testbed.forget, moved)
    run = tmp_path / "run"
    argv = _argv("fit", testbed, full_ft_checkpoint, run, "--model.init_args.adapter.kind=full",
                 "--model.init_args.optim.lr=0.001")  # fmt: skip
    argv = [a.replace(str(testbed.forget), str(moved)) for a in argv]
    assert any(str(moved) in a for a in argv)
    with caplog.at_level(logging.WARNING, logger="lightning_unlearn"):
        main(argv)  # before: "was trained on other data: forget_path: checkpoint … → configured …"
    assert not [r for r in caplog.records if "changed data" in r.getMessage()]
    moved.write_text(moved.read_text().replace("a", "b", 1))  # the same path with other bytes is still refused
    with pytest.raises(SystemExit, match="was trained on other data: forget_path: checkpoint"):
        main([a.replace(str(run), str(tmp_path / "run2")) for a in argv])
