"""RMU on the tiny testbed: block ℓ's output as the hidden states, the start model as the retain target, only the
chosen blocks' parameters trained, and u seeded and carried by checkpoints."""

import dataclasses

import pytest
import torch
import yaml
from conftest import fit

from lightning_unlearn.cli import main
from lightning_unlearn.configs import config_root
from lightning_unlearn.data.unlearning import ForgetRetainDataModule
from lightning_unlearn.losses import IGNORE_INDEX
from lightning_unlearn.models import AdapterConfig, load_causal_lm
from lightning_unlearn.objectives import RMU, OptimizerConfig

LAYER = 2  # of the testbed's 4 blocks: blocks 0-2 train, block 3 cannot change h_2


def _batch(testbed):
    dm = ForgetRetainDataModule(testbed.model_dir, testbed.forget, testbed.retain, batch_size=2)
    dm.setup()
    return next(iter(dm.train_dataloader()))[0]


def _rmu(testbed, kind="full", **kwargs):
    return RMU(testbed.model_dir, AdapterConfig(kind=kind, dropout=0.0), **{"layer": LAYER, **kwargs})


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_rmu_at_the_start_model_reads_hidden_states_of_block_l_and_has_no_retain_loss(testbed, kind):
    module = _rmu(testbed, kind, steering_coeff=3.0, gamma=2.0, alpha=5.0)
    batch = _batch(testbed)
    loss, logs = module.unlearning_loss(batch)
    assert logs["rmu_retain_loss"].item() == pytest.approx(0.0, abs=1e-10)  # π_θ = the frozen start model
    forget = batch["forget"]
    with torch.no_grad():  # HF's hidden_states[ℓ + 1] is block ℓ's output (ℓ not the last block)
        hidden = load_causal_lm(testbed.model_dir)(
            input_ids=forget["input_ids"], attention_mask=forget["attention_mask"], output_hidden_states=True
        ).hidden_states[LAYER + 1]
    mask = forget["labels"] != IGNORE_INDEX
    per_position = (hidden - module.control_vector).pow(2).mean(-1)
    want = ((per_position * mask).sum(-1) / mask.sum(-1)).mean()
    assert logs["rmu_forget_loss"].item() == pytest.approx(want.item(), rel=1e-5)
    assert loss.item() == pytest.approx(2.0 * want.item(), rel=1e-5)
    assert module.control_vector.norm().item() == pytest.approx(3.0, rel=1e-6)
    assert (module.reference_model is None) == (kind == "lora")


def test_rmu_positions_all_averages_over_the_prompt_too(testbed):
    batch = _batch(testbed)
    answer, everywhere = _rmu(testbed), _rmu(testbed, positions="all", token_average="batch")
    _, logs_answer = answer.unlearning_loss(batch)
    _, logs_all = everywhere.unlearning_loss(batch)
    forget = batch["forget"]
    with torch.no_grad():
        hidden = everywhere.model(
            input_ids=forget["input_ids"], attention_mask=forget["attention_mask"], output_hidden_states=True
        ).hidden_states[LAYER + 1]
    mask = forget["attention_mask"].bool()
    want = ((hidden - everywhere.control_vector).pow(2).mean(-1) * mask).sum() / mask.sum()
    assert logs_all["rmu_forget_loss"].item() == pytest.approx(want.item(), rel=1e-5)
    assert logs_all["rmu_forget_loss"].item() != pytest.approx(logs_answer["rmu_forget_loss"].item(), rel=1e-3)


def test_full_fine_tuning_updates_only_the_down_projections_of_blocks_l_minus_2_to_l(testbed):
    module = _rmu(testbed, optim=OptimizerConfig(lr=1e-2))
    trainable = [n for n, p in module.model.named_parameters() if p.requires_grad]
    assert trainable == [f"model.layers.{i}.mlp.down_proj.weight" for i in (0, 1, 2)]
    _, before = module.unlearning_loss(_batch(testbed))
    fit(module, testbed, max_steps=15)
    start = load_causal_lm(testbed.model_dir).state_dict()
    changed = {k for k, v in module.model.state_dict().items() if not torch.equal(v, start[k])}
    assert changed == set(trainable)
    _, after = module.unlearning_loss(_batch(testbed))
    # the forget states moved toward c·u much more than the retain states moved away from the start model
    assert after["rmu_forget_loss"] < 0.5 * before["rmu_forget_loss"]
    assert after["rmu_retain_loss"] < 0.1 * before["rmu_forget_loss"]


def _adapted(module) -> set[str]:
    """``"<block>.<module>"`` of every trainable LoRA tensor."""
    return {n.split(".layers.")[1].split(".lora_")[0] for n, p in module.model.named_parameters() if p.requires_grad}


def test_lora_adapters_go_only_where_rmu_updates_unless_the_adapter_config_says(testbed):
    module = _rmu(testbed, "lora")
    assert _adapted(module) == {f"{i}.mlp.down_proj" for i in (0, 1, 2)}
    assert module.hparams.adapter.layers is None  # the given config is recorded as given
    chosen = RMU(testbed.model_dir, AdapterConfig(kind="lora", layers=[2], target_modules=["q_proj"]), layer=LAYER)
    assert _adapted(chosen) == {"2.self_attn.q_proj"}
    everything = _rmu(testbed, "full", restrict_updates=False)
    assert all(p.requires_grad for p in everything.model.parameters())


def test_u_is_seeded_and_travels_in_the_state_dict(testbed):
    first, again, other = _rmu(testbed, steering_seed=5), _rmu(testbed, steering_seed=5), _rmu(testbed, steering_seed=6)
    assert torch.equal(first.control_vector, again.control_vector)
    assert not torch.equal(first.control_vector, other.control_vector)
    _ = first.model
    state = first.state_dict()
    assert torch.equal(state["control_vector"], first.control_vector)
    other.load_state_dict(state)  # a resume steers toward the checkpoint's u, whatever steering_seed says
    assert torch.equal(other.control_vector, first.control_vector)
    lora = _rmu(testbed, "lora", steering_seed=5)
    _ = lora.model
    lora_state = {k: v for k, v in lora.state_dict().items() if k not in lora.frozen_weight_keys()}
    assert "control_vector" in lora_state
    _rmu(testbed, "lora", steering_seed=6).load_state_dict(lora_state)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer": 4}, "layer=4 is not a block"),
        ({"updated_layers": [3]}, "blocks after ℓ do not change h_ℓ"),
        ({"positions": "prompt"}, "positions='prompt'"),
        ({"updated_params": ["mlp.nothing"]}, "no parameter of blocks"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(testbed, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _ = _rmu(testbed, **kwargs).model


def test_lens_config_states_the_lens_protocol_and_openunlearnings_rmu_settings():
    text = (config_root() / "lens" / "rmu.yaml").read_text()
    assert "lightning-unlearn fit -c lens/rmu.yaml" in text.split("seed_everything")[0]
    cfg = yaml.safe_load(text)
    assert cfg["trainer"]["max_steps"] == 260
    assert cfg["trainer"]["callbacks"][0]["init_args"]["every_n_train_steps"] == 10
    init = cfg["model"]["init_args"]
    assert init["adapter"] == {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.05} and init["optim"]["lr"] == 1e-5
    # OpenUnlearning's configs/experiment/unlearn/wmdp/default.yaml: model.layers.7, blocks 5-7 down_proj, c 2, α 1, γ 1
    assert (init["layer"], init["updated_params"], init["steering_coeff"], init["alpha"], init["gamma"]) == (
        7,
        ["mlp.down_proj"],
        2.0,
        1.0,
        1.0,
    )


def test_lens_config_trains_two_lora_steps_through_the_cli(testbed, tmp_path):
    main([
        "fit", "-c", "lens/rmu.yaml",
        f"--model.init_args.model_path={testbed.model_dir}", f"--data.init_args.tokenizer_path={testbed.model_dir}",
        f"--data.init_args.forget_path={testbed.forget}", f"--data.init_args.retain_path={testbed.retain}",
        f"--model.init_args.layer={LAYER}",  # the testbed has 4 blocks
        "--data.init_args.batch_size=2", "--data.init_args.max_length=64", "--model.init_args.optim.lr=1e-3",
        "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
        "--trainer.logger=false", "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks.init_args.every_n_train_steps=1",
    ])  # fmt: skip
    checkpoints = sorted(tmp_path.rglob("step=*.ckpt"))
    assert [p.name for p in checkpoints] == ["step=1.ckpt", "step=2.ckpt"]
    state = torch.load(checkpoints[-1], map_location="cpu", weights_only=True)["state_dict"]
    assert torch.equal(state["control_vector"], _rmu(testbed).control_vector)  # steering_seed 0
    lora = sorted(k for k in state if "lora_" in k)
    assert lora and all(".mlp.down_proj." in k and any(f"layers.{i}." in k for i in (0, 1, 2)) for k in lora), lora
    assert (next(tmp_path.rglob("adapter-step=2")) / "adapter_config.json").exists()


def test_rmu_trains_with_adalora_on_the_chosen_blocks_and_keeps_u(testbed):
    module = _rmu(testbed, "adalora", optim=OptimizerConfig(lr=1e-2))
    module.adapter_config = dataclasses.replace(module.adapter_config, r=4, total_step=4)
    u = module.control_vector.clone()
    _, before = module.unlearning_loss(_batch(testbed))
    trainer = fit(module, testbed, max_steps=4)
    assert trainer.global_step == 4 and module.stop_reason is None
    assert _adapted(module) == {f"{i}.mlp.down_proj" for i in (0, 1, 2)}
    assert any("lora_E" in n for n, p in module.model.named_parameters() if p.requires_grad)  # AdaLoRA's SVD form
    assert torch.equal(module.control_vector, u)  # a buffer: no optimizer touches it
    _, after = module.unlearning_loss(_batch(testbed))
    assert after["rmu_forget_loss"] < before["rmu_forget_loss"]


def test_rmu_under_a_masked_strategy_updates_only_inside_the_allowed_groups(testbed):
    """The masked strategies' contract (``packed_masks``, ``restrict_update_groups``) on RMU with full fine-tuning:
    its three trainable down-projections change only inside the union of groups 0-2 (block 2 lies outside θ_mask =
    blocks 0-1, so it stays as it was), and the control vector is untouched."""
    from lightning_unlearn.masks import group_mask, load_masks
    from lightning_unlearn.strategies import MaskedSingleDeviceStrategy

    module = _rmu(testbed, optim=OptimizerConfig(lr=1e-2))
    masks, _ = load_masks(testbed.masks)
    module.packed_masks, module.restrict_update_groups = masks, [0, 1, 2]
    u = module.control_vector.clone()
    before = {n: p.detach().clone() for n, p in module.model.named_parameters() if p.requires_grad}
    fit(module, testbed, max_steps=3, strategy=MaskedSingleDeviceStrategy())
    moved = 0
    for name, param in module.model.named_parameters():
        if name not in before:
            continue
        key = next(k for k in masks if name.endswith(k))
        allowed = group_mask(masks[key], [0, 1, 2])
        assert torch.equal(param.detach()[~allowed], before[name][~allowed]), f"{name} changed outside the masks"
        moved += int((param.detach()[allowed] != before[name][allowed]).sum())
    assert moved > 0
    assert torch.equal(module.control_vector, u)


def test_rmu_stops_under_the_stop_rule_and_the_collapse_guard(testbed, tmp_path):
    """max_bad_loss bounds the forget NLL, collapse_fraction the retain NLL (RMU logs both without gradient): a
    bound the start model already breaks stops the run at once (step 0, the start weights) with no update; at lr 1e6
    the steered blocks wreck the output and the collapse guard catches it, keeping no checkpoint of those weights."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    start = {n: p.detach().clone() for n, p in _rmu(testbed).model.named_parameters()}
    bounded = _rmu(testbed, optim=OptimizerConfig(lr=1e-2), max_bad_loss=1e-6)
    fit(bounded, testbed, max_steps=3)
    assert bounded.stopped_at_step == 0 and "max_bad_loss" in bounded.stop_reason
    assert all(torch.equal(p, start[n]) for n, p in bounded.model.named_parameters())
    wrecked = _rmu(testbed, optim=OptimizerConfig(lr=1e6, schedule="constant"), collapse_fraction=0.9)
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    fit(wrecked, testbed, max_steps=4, callbacks=[ckpt], enable_checkpointing=True)
    # measured: a finite retain NLL̄ of 5.62 after step 1, above 0.9 · ln |V| = 0.9 · ln 300 = 5.13
    assert wrecked.stopped_at_step == 1 and "collapse_fraction=0.9" in wrecked.stop_reason
    assert not list(tmp_path.glob("*.ckpt"))  # step 1's wrecked weights are not kept
