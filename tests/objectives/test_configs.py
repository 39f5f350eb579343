"""Every shipped unlearning YAML parses with the real CLI and runs 2 steps on the tiny testbed."""

import pytest
import yaml

from lightning_unlearn.cli import main
from lightning_unlearn.configs import config_root

CONFIGS = config_root()
LENS = ["tofu_ga", "tofu_gd", "ga_retain", "npo"]
LACUNA = ["simnpo", "oracle_grad", "memflex", "alphaedit"]
# Tiny-model values where the 1B ones do not apply (4 blocks; key and gradient scales of a 32-wide model).
TINY = {
    "memflex": ["--model.init_args.gradient_threshold=1e-4"],
    "alphaedit": ["--model.init_args.layers=[0, 1]", "--model.init_args.l2=1e-4", "--model.init_args.v_steps=5"],
}


def test_configs_state_the_paper_settings():
    for name in LENS:
        cfg = yaml.safe_load((CONFIGS / "lens" / f"{name}.yaml").read_text())
        assert cfg["trainer"]["max_steps"] == 260
        assert cfg["trainer"]["callbacks"][0]["init_args"]["every_n_train_steps"] == 10
        assert cfg["model"]["init_args"]["adapter"] == {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.05}
        assert cfg["model"]["init_args"]["optim"]["lr"] == 1e-5
    simnpo = yaml.safe_load((CONFIGS / "lacuna" / "simnpo.yaml").read_text())["model"]["init_args"]
    assert (simnpo["gamma"], simnpo["alpha"], simnpo["beta"], simnpo["delta"], simnpo["optim"]["lr"]) == (
        3.0,
        0.01,
        10.0,
        1.5,
        1e-4,
    )
    oracle = yaml.safe_load((CONFIGS / "lacuna" / "oracle_grad.yaml").read_text())["model"]["init_args"]
    assert (oracle["gamma"], oracle["alpha"], oracle["forget_groups"]) == (5.0, 1.0, [0, 1, 2])
    for path in [*(CONFIGS / "lens").glob("*.yaml"), *(CONFIGS / "lacuna").glob("*.yaml")]:
        if path.stem in LENS + LACUNA:
            assert "lightning-unlearn fit -c " in path.read_text().split("\n\n")[0], path


@pytest.mark.parametrize("path", [f"lens/{n}" for n in LENS] + [f"lacuna/{n}" for n in LACUNA])
def test_config_runs_two_steps(testbed, tmp_path, path):
    argv = [
        "fit",
        "-c",
        str(CONFIGS / f"{path}.yaml"),
        f"--model.init_args.model_path={testbed.model_dir}",
        f"--data.init_args.tokenizer_path={testbed.model_dir}",
        f"--data.init_args.forget_path={testbed.forget}",
        f"--data.init_args.retain_path={testbed.retain}",
        "--data.init_args.batch_size=2",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    if path == "lacuna/oracle_grad":
        argv.append(f"--model.init_args.masks_path={testbed.masks}")
    argv += TINY.get(path.split("/")[1], [])
    main(argv)
    assert (tmp_path / "config.yaml").exists() or any(tmp_path.rglob("config.yaml"))
