import json

import pytest
import torch
from safetensors.torch import save_file

from lightning_unlearn.models import LazyWeights, eval_mode, load_weights

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def test_lazy_weights_read_each_tensor_of_a_sharded_directory_on_access(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "base_model.model.model.layers.0.mlp.up_proj.weight": torch.randn(6, 4, generator=g),  # peft-wrapped name
        "model.layers.0.mlp.up_proj.bias": torch.randn(6, generator=g),
        "lm_head.weight": torch.randn(3, 4, generator=g).to(torch.bfloat16),
    }
    folder = tmp_path / "model"
    folder.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": list(tensors)[:2],
        "model-00002-of-00002.safetensors": ["lm_head.weight"],
    }
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    lazy = load_weights(folder, lazy=True)
    eager = load_weights(folder)
    assert isinstance(lazy, LazyWeights) and set(lazy) == set(eager) == {
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.up_proj.bias",
        "lm_head.weight",
    }
    assert lazy.shapes == {n: tuple(t.shape) for n, t in eager.items()}
    assert all(torch.equal(lazy[n], eager[n]) and lazy[n].dtype == eager[n].dtype for n in eager)
    assert lazy["lm_head.weight"] is not lazy["lm_head.weight"]  # read again, not cached
    with pytest.raises(KeyError):
        lazy["model.embed_tokens.weight"]
    with pytest.raises(FileNotFoundError, match="missing"):
        load_weights(tmp_path / "missing", lazy=True)


def _three_adapters(tiny_dir, tmp_path, alphas=(10, 7, 16)):
    """A peft model holding three saved LoRA adapters of different ranks, scalings and targets (random B, so each
    changes the output): "r4" on every projection, "r2" on q/v/down, "q_only" on q_proj alone. ``alphas``: their
    ``lora_alpha`` (the default gives scalings 2.5, 3.5 and 4)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from lightning_unlearn.models import load_causal_lm

    every = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    specs = {
        "r4": LoraConfig(r=4, lora_alpha=alphas[0], init_lora_weights=False, target_modules=every),
        "r2": LoraConfig(r=2, lora_alpha=alphas[1], init_lora_weights=False,
                         target_modules=["q_proj", "v_proj", "down_proj"]),
        "q_only": LoraConfig(r=4, lora_alpha=alphas[2], init_lora_weights=False, target_modules=["q_proj"]),
    }  # fmt: skip
    for k, (name, config) in enumerate(specs.items()):
        torch.manual_seed(k)
        get_peft_model(load_causal_lm(tiny_dir), config).save_pretrained(tmp_path / name)
    names = list(specs)
    model = PeftModel.from_pretrained(load_causal_lm(tiny_dir), tmp_path / names[0], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(tmp_path / name, adapter_name=name)
    return model.eval(), names


@pytest.mark.parametrize("alphas", [(10, 7, 16), (8, 1, 32)], ids=["scalings", "powers_of_two"])
def test_lora_adapter_blocks_give_each_block_the_logits_of_its_adapter_alone(tiny_dir, tmp_path, alphas):
    from lightning_unlearn.models import _stacked_lora_weights, lora_adapter_blocks

    model, names = _three_adapters(tiny_dir, tmp_path, alphas)
    q_proj = model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj")
    folded = _stacked_lora_weights(q_proj, names)[2] is None  # scalings 2, 0.5 and 8 fold into B; 2.5, 3.5, 4 do not
    assert folded == (alphas == (8, 1, 32))
    ids = torch.randint(3, 300, (2, 7), generator=torch.Generator().manual_seed(0))
    alone = {}
    with torch.no_grad():
        for name in names:
            model.set_adapter(name)
            alone[name] = model(input_ids=ids).logits
        model.set_adapter("r2")
        order = ["q_only", "r4", "r2", "r4"]  # any order, an adapter twice
        with lora_adapter_blocks(model, order):
            blocks = model(input_ids=ids.repeat(len(order), 1)).logits.split(2)
        after = model(input_ids=ids).logits
    for name, block in zip(order, blocks):
        assert (block - alone[name]).abs().max() <= 1e-6, name
    assert len({round(float(a.sum()), 3) for a in alone.values()}) == 3  # three different models
    assert torch.equal(after, alone["r2"]) and model.active_adapter == "r2"  # as it was, outside


def test_a_power_of_two_scaling_folded_into_b_gives_the_same_bits():
    """Folding a power-of-two LoRA scaling into B is exact: every layer output is bit for bit the unfolded one."""
    from peft import LoraConfig, get_peft_model

    from lightning_unlearn.models import _adapter_blocks_forward, _stacked_lora_weights

    torch.manual_seed(0)
    model = get_peft_model(
        torch.nn.Sequential(torch.nn.Linear(48, 80, bias=False)),
        LoraConfig(r=4, lora_alpha=16, init_lora_weights=False, target_modules=["0"]),
    )
    model.add_adapter("small", LoraConfig(r=8, lora_alpha=4, init_lora_weights=False, target_modules=["0"]))
    layer, names = model.base_model.model[0], ["default", "small", "default"]
    a, b, scale = _stacked_lora_weights(layer, names)
    assert scale is None  # scalings 4 and 0.5
    pad = {"default": 4, "small": 0}  # rank 4 zero-padded to 8
    b_unscaled = torch.stack([torch.nn.functional.pad(layer.lora_B[n].weight, (0, pad[n])) for n in names])
    unfolded = (a, b_unscaled.transpose(1, 2), torch.tensor([4.0, 0.5, 4.0])[:, None, None])
    assert not torch.equal(b, unfolded[1])
    with torch.no_grad():
        for shape in [(6, 1, 48), (3 * 13, 5, 48)]:
            x = torch.randn(shape)
            folded = _adapter_blocks_forward(layer, (a, b, None), x)
            assert torch.equal(folded, _adapter_blocks_forward(layer, unfolded, x)), shape
            model.set_adapter("small")
            alone = model(x[shape[0] // 3 : 2 * shape[0] // 3])
            assert (folded[shape[0] // 3 : 2 * shape[0] // 3] - alone).abs().max() <= 1e-6


def test_lora_adapter_blocks_refuse_what_they_cannot_compute(tiny_dir, tmp_path):
    from peft import AdaLoraConfig, LoraConfig, get_peft_model

    from lightning_unlearn.models import load_causal_lm, lora_adapter_blocks

    model, names = _three_adapters(tiny_dir, tmp_path)
    with pytest.raises(ValueError, match=r"no LoRA layer of the model holds adapter\(s\) \['step=9'\]"):
        with lora_adapter_blocks(model, [*names, "step=9"]):
            pass
    with pytest.raises(ValueError, match="not 3 equal blocks"), torch.no_grad():
        with lora_adapter_blocks(model, names):
            model(input_ids=torch.ones(4, 3, dtype=torch.long))
    assert "forward" not in vars(model.base_model.model.model.layers[0].self_attn.q_proj)  # restored after an error
    model.train()
    with pytest.raises(ValueError, match="model.eval"):
        with lora_adapter_blocks(model, names):
            pass
    adalora = AdaLoraConfig(init_r=4, target_r=2, total_step=10, target_modules=["v_proj"])
    adalora_model = get_peft_model(load_causal_lm(tiny_dir), adalora).eval()
    with pytest.raises(ValueError, match=r"v_proj is a SVDLinear, not a LoRA linear layer; .*adapters_per_pass 1"):
        with lora_adapter_blocks(adalora_model, ["default"]):
            pass
    dora = get_peft_model(load_causal_lm(tiny_dir), LoraConfig(r=2, target_modules=["v_proj"], use_dora=True)).eval()
    with pytest.raises(ValueError, match="adapter 'default' of .*v_proj is a LoRA variant .*adapters_per_pass 1"):
        with lora_adapter_blocks(dora, ["default"]):
            pass


def test_eval_mode_restores_each_submodule_mode_even_after_an_error():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5), torch.nn.Linear(2, 2))
    model.train()
    model[2].eval()  # a frozen part kept in eval mode on purpose
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model):
        assert not any(m.training for m in model.modules()) and not torch.is_grad_enabled()
        raise RuntimeError("inside")
    assert [m.training for m in model.modules()] == [True, True, True, False] and torch.is_grad_enabled()
    with eval_mode(model, grad=True):
        assert torch.is_grad_enabled() and not model[1].training


def test_block_output_is_hfs_hidden_state_after_the_block_with_or_without_an_adapter(tiny_dir):
    from lightning_unlearn.models import AdapterConfig, apply_adapter, block_output, load_causal_lm

    ids = torch.tensor([[1, 5, 9, 4], [1, 7, 3, 2]])
    for model in (load_causal_lm(tiny_dir), apply_adapter(load_causal_lm(tiny_dir), AdapterConfig(kind="lora"))):
        with torch.no_grad(), block_output(model, 0) as captured:
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        assert len(captured) == 1 and torch.equal(captured[0], hidden[1])
        model(input_ids=ids)  # the hook is gone
        assert len(captured) == 1
        with pytest.raises(ValueError, match=r"found 0 modules named …layers.99"), block_output(model, 99):
            pass
