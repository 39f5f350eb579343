"""The issue-32 LENS configs (IdkNLL, DPO, IdkDPO, UNDIAL, WGA, SatImp): each runs 2 LoRA steps through the CLI, in
this process, on the tiny testbed, and states the hyperparameters its header cites."""

import pytest
import yaml
from conftest import FORGET, write_jsonl

from lightning_unlearn.cli import main
from lightning_unlearn.configs import config_root

CONFIGS = config_root() / "lens"
METHODS = ["idk_nll", "dpo", "idk_dpo", "undial", "wga", "satimp"]
# OpenUnlearning's configs (configs/trainer/*.yaml) for the method hyperparameters; the LENS protocol for the rest.
EXPECTED = {
    "idk_nll": {"gamma": 1.0, "alpha": 1.0, "idk_answers": "en"},
    "dpo": {"beta": 0.1, "gamma": 1.0, "alpha": 1.0, "scale": "one"},
    "idk_dpo": {"beta": 0.1, "gamma": 1.0, "alpha": 1.0, "scale": "one", "idk_answers": "en"},
    "undial": {"strength": 10.0, "gamma": 1.0, "alpha": 0.0},
    "wga": {"beta": 1.0, "gamma": 1.0, "alpha": 1.0},
    "satimp": {"beta1": 5.0, "beta2": 1.0, "gamma": 0.1, "alpha": 1.0},
}


def test_configs_state_the_lens_protocol_and_the_method_settings():
    for name in METHODS:
        text = (CONFIGS / f"{name}.yaml").read_text()
        cfg = yaml.safe_load(text)
        assert f"lightning-unlearn fit -c lens/{name}.yaml" in text.split("seed_everything")[0], name
        assert cfg["trainer"]["max_steps"] == 260, name
        assert cfg["trainer"]["callbacks"][0]["init_args"]["every_n_train_steps"] == 10, name
        init = cfg["model"]["init_args"]
        assert init["adapter"] == {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.05}, name
        assert init["optim"]["lr"] == 1e-5, name
        assert {k: init[k] for k in EXPECTED[name]} == EXPECTED[name], name


@pytest.mark.parametrize("name", METHODS)
def test_config_trains_two_lora_steps_through_the_cli(testbed, tmp_path, name):
    forget = testbed.forget
    if name == "dpo":  # DPO reads its preferred answers from the data
        forget = tmp_path / "forget_preferred.jsonl"
        write_jsonl(forget, [{**r, "preferred": "I do not know."} for r in FORGET])
    main([
        "fit", "-c", f"lens/{name}.yaml",
        f"--model.init_args.model_path={testbed.model_dir}", f"--data.init_args.tokenizer_path={testbed.model_dir}",
        f"--data.init_args.forget_path={forget}", f"--data.init_args.retain_path={testbed.retain}",
        "--data.init_args.batch_size=2", "--data.init_args.max_length=64", "--model.init_args.optim.lr=1e-3",
        "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
        "--trainer.logger=false", "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks.init_args.every_n_train_steps=1",
    ])  # fmt: skip
    checkpoints = sorted(p.name for p in tmp_path.rglob("step=*.ckpt"))
    assert checkpoints == ["step=1.ckpt", "step=2.ckpt"], checkpoints
    assert (tmp_path.rglob("adapter-step=2").__next__() / "adapter_config.json").exists()
