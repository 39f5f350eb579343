"""Every shipped trainer config parses and builds a Trainer with the masked strategy it names."""

import pytest
import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch import Trainer

from lightning_unlearn.configs import config_root
from lightning_unlearn.strategies import MaskedDDPStrategy, MaskedFSDPStrategy, MaskedSingleDeviceStrategy

CONFIGS = config_root() / "trainer"
EXPECTED = {
    "single_cpu.yaml": MaskedSingleDeviceStrategy,
    "ddp_cpu.yaml": MaskedDDPStrategy,
    "fsdp_cpu.yaml": MaskedFSDPStrategy,
}


def test_every_trainer_config_is_known():
    assert {p.name for p in CONFIGS.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_trainer_config_builds_its_strategy(name, tmp_path):
    text = (CONFIGS / name).read_text()
    assert text.startswith("#") and "lightning-unlearn fit" in text  # the header says how to run it
    parser = ArgumentParser()
    parser.add_class_arguments(Trainer, "trainer")
    cfg = parser.parse_object({"trainer": yaml.safe_load(text)["trainer"]})
    cfg.trainer.default_root_dir = str(tmp_path)
    cfg.trainer.logger = False
    trainer = parser.instantiate_classes(cfg).trainer
    assert isinstance(trainer.strategy, EXPECTED[name])
