import pytest
import torch
from conftest import FORGET, fit, mean_nll, nll_change

from lightning_unlearn.masks import load_masks, union_mask
from lightning_unlearn.models import AdapterConfig, load_causal_lm
from lightning_unlearn.objectives import OptimizerConfig, OracleGrad
from lightning_unlearn.objectives.oracle_grad import merged_state_dict
from lightning_unlearn.strategies import MaskedSingleDeviceStrategy


def _forget_mask(testbed):
    packed, _ = load_masks(testbed.masks)
    return union_mask(packed, [0, 1, 2])


def test_oracle_grad_full_changes_only_forget_mask_elements(testbed):
    module = OracleGrad(testbed.model_dir, testbed.masks, AdapterConfig(kind="full"), OptimizerConfig(lr=1e-3))
    assert (module.gamma, module.alpha, module.restrict_update_groups) == (5.0, 1.0, [0, 1, 2])
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    fit(module, testbed, strategy=MaskedSingleDeviceStrategy())
    mask = _forget_mask(testbed)
    for name, p in module.model.named_parameters():
        assert torch.equal(p[~mask[name]], before[name][~mask[name]]), name
    assert sum(int((p != before[n]).sum()) for n, p in module.model.named_parameters()) > 0
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 0.5


def test_oracle_grad_lora_delta_is_confined_to_forget_mask(testbed):
    module = OracleGrad(
        testbed.model_dir, testbed.masks, AdapterConfig(kind="lora", dropout=0.0), OptimizerConfig(lr=1e-2)
    )
    fit(module, testbed)  # no masked strategy needed: the restriction is inside the adapted layers
    d_forget, d_retain = nll_change(module.model, testbed)
    assert d_forget > d_retain and d_forget > 1.0
    merged = merged_state_dict(module.model, module.model.state_dict())
    start = load_causal_lm(testbed.model_dir)
    mask = _forget_mask(testbed)
    for name, w in start.state_dict().items():
        assert torch.equal(merged[name][~mask[name]], w[~mask[name]]), name
    start.load_state_dict(merged)
    assert mean_nll(start, testbed.tokenizer, FORGET) == pytest.approx(
        mean_nll(module.model, testbed.tokenizer, FORGET), rel=1e-4
    )


def test_oracle_grad_full_refuses_an_unmasked_strategy(testbed):
    module = OracleGrad(testbed.model_dir, testbed.masks, AdapterConfig(kind="full"))
    with pytest.raises(TypeError, match="MaskedSingleDeviceStrategy"):
        fit(module, testbed, max_steps=1)


def test_oracle_grad_rejects_masks_of_another_model(testbed, tmp_path):
    from lightning_unlearn.masks import save_masks

    packed, _ = load_masks(testbed.masks)
    packed.pop(next(iter(packed)))
    save_masks(tmp_path / "bad.safetensors", packed)
    with pytest.raises(ValueError, match="another model"):
        OracleGrad(testbed.model_dir, str(tmp_path / "bad.safetensors"), AdapterConfig(kind="full"))


def test_evaluate_scores_merged_step_directories_as_training_did(testbed, tmp_path):
    """A LoRA OracleGrad run writes merged-step=N/ models. `evaluate` on a copy without its checkpoint files and
    rows evaluates those directories: the same retain-drift rows as training (≤ 1e-6), KL to the start model
    included, so the base came from the configured model and the scores from the merged weights."""
    import json
    import shutil

    import yaml

    from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
    from lightning_unlearn.cli import main as cli_main
    from lightning_unlearn.workflows.evaluate import evaluate_command, saved_checkpoints

    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 4, "default_root_dir": str(tmp_path / "og"),
                    "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1,
                    "limit_val_batches": 0, "callbacks": [
                        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                         "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "{step}"}},
                        {"class_path": "lightning_unlearn.callbacks.RetainDriftEvaluation",
                         "init_args": {"records": testbed.retain, "batch_size": 4}}]},
        "model": {"class_path": "lightning_unlearn.objectives.OracleGrad",
                  "init_args": {"model_path": testbed.model_dir, "masks_path": testbed.masks,
                                "adapter": {"kind": "lora", "dropout": 0.0},
                                "optim": {"lr": 1.0e-2, "schedule": "constant"}}},
        "data": {"class_path": "lightning_unlearn.data.unlearning.ForgetRetainDataModule",
                 "init_args": {"tokenizer_path": testbed.model_dir, "forget_path": testbed.forget,
                               "retain_path": testbed.retain, "batch_size": 2, "max_length": 64}},
    }  # fmt: skip
    (tmp_path / "og.yaml").write_text(yaml.safe_dump(config))
    cli_main(["fit", "-c", str(tmp_path / "og.yaml")])
    (run,) = [p.parent for p in (tmp_path / "og").rglob("checkpoint_metrics.jsonl")]
    trained = {(r["step"], r["family"]): r for r in read_rows(run / "checkpoint_metrics.jsonl")}
    assert sorted(trained) == [(2, "retain_drift"), (4, "retain_drift")]
    assert all(r["kl"] > 0 for r in trained.values()) and trained[(2, "retain_drift")]["kl"] != pytest.approx(
        trained[(4, "retain_drift")]["kl"]
    )

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "checkpoint_metrics.jsonl").unlink()
    for ckpt in copy.rglob("*.ckpt"):
        ckpt.unlink()
    assert {c.step: c.kind for c in saved_checkpoints(copy)} == {2: "merged", 4: "merged"}
    out = evaluate_command(copy)
    assert [e["step"] for e in out["evaluated"]] == [2, 4] and out["skipped"] == []
    rows = {(r["step"], r["family"]): r for r in read_rows(copy / "checkpoint_metrics.jsonl")}
    assert rows.keys() == trained.keys()
    for key, row in rows.items():
        for name in ("ce", "ppl", "kl", "delta_ce"):
            assert row[name] == pytest.approx(trained[key][name], abs=1e-6), (key, name, json.dumps(row))

    # A model that changed a weight the run never adapted is not this run's merge: refused, by name.
    from safetensors.torch import load_file, save_file

    from lightning_unlearn.objectives.oracle_grad import load_merged_delta

    (weights,) = (copy / "checkpoints" / "merged-step=4").glob("*.safetensors")
    state = load_file(str(weights))
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"] + 1.0
    (tmp_path / "other").mkdir()
    save_file(state, str(tmp_path / "other" / "model.safetensors"))
    module = OracleGrad(testbed.model_dir, testbed.masks, AdapterConfig(kind="lora", dropout=0.0))
    with pytest.raises(ValueError, match="changes model.embed_tokens.weight"):
        load_merged_delta(module.model, tmp_path / "other")
