"""The meta-device memory plan: its activation count equals what a real step saves, its parts follow the formulas,
and the 1B Lacuna recipe fits one 80 GB GPU."""

from __future__ import annotations

import doctest

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Olmo2Config

import lightning_unlearn.memory_plan as memory_plan
from lightning_unlearn.configs import config_root
from lightning_unlearn.errors import ConfigError
from lightning_unlearn.memory_plan import saved_activation_bytes, training_memory

TINY = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4)


def _storage_bytes_saved(model, batch) -> int:
    """The ground truth on real tensors: distinct storages autograd saves, weights' storages excluded."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in weights:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**batch).loss.backward()
    return sum(storages.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_meta_count_of_saved_activations_equals_a_real_steps_storages(dtype):
    # On the meta device attention runs its math path (it saves the probabilities); a real step is compared on the
    # same path. A fused kernel (flash, memory-efficient) saves less: the plan is an upper bound there.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    ids = torch.randint(0, TINY.vocab_size, (3, 11))
    batch = {"input_ids": ids, "labels": ids}
    real = LlamaForCausalLM(TINY).to(dtype)
    with sdpa_kernel(SDPBackend.MATH):
        truth = _storage_bytes_saved(real, batch)
        same = saved_activation_bytes(LlamaForCausalLM(TINY).to(dtype), batch)
    with torch.device("meta"):
        meta = LlamaForCausalLM(TINY).to(dtype)
        meta_batch = {k: torch.zeros_like(v, device="meta") for k, v in batch.items()}
    assert saved_activation_bytes(meta, meta_batch) == truth > 0
    assert same == truth  # the same count on real tensors


def test_the_parts_follow_the_formulas_on_a_tiny_model():
    plan = training_memory(lambda: LlamaForCausalLM(TINY), batch_size=2, max_length=8, trainable="masked")
    model = LlamaForCausalLM(TINY)
    n = sum(p.numel() for p in model.parameters())
    # θ_mask: every weight but the input embeddings, the norms and the last two of the four blocks
    out_of_mask = ("norm", ".layers.2.", ".layers.3.")
    outside = model.model.embed_tokens.weight.numel() + sum(
        p.numel() for name, p in model.named_parameters() if any(part in name for part in out_of_mask)
    )
    assert plan["parameters"] == n and plan["trainable_parameters"] == plan["masked_parameters"] == n - outside
    b = plan["bytes"]
    trained = n - outside
    assert (b["weights"], b["gradients"], b["optimizer"], b["masks"]) == (4 * n, 4 * trained, 8 * trained, 4 * trained)
    full = training_memory(lambda: LlamaForCausalLM(TINY), batch_size=2, max_length=8, trainable="all")
    assert full["trainable_parameters"] == n and full["bytes"]["masks"] == 0
    act = {b: training_memory(lambda: LlamaForCausalLM(TINY), b, 8)["bytes"]["activations"] for b in (4, 6)}
    act[2] = plan["bytes"]["activations"]
    assert act[6] - act[4] == act[4] - act[2] > 0  # linear in the batch (beside the positions' rotary tables)
    with pytest.raises(ConfigError, match="precision='fp8'"):
        training_memory(lambda: LlamaForCausalLM(TINY), 2, 8, precision="fp8")


def test_the_1b_recipe_fits_one_80_gb_gpu():
    recipe = yaml.safe_load((config_root() / "lacuna" / "inject_1b.yaml").read_text(encoding="utf-8"))
    data = recipe["data"]["init_args"]
    config = Olmo2Config(vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)  # fmt: skip
    plan = training_memory(lambda: AutoModelForCausalLM.from_config(config), data["batch_size"], data["max_length"],
                           recipe["trainer"]["precision"])  # fmt: skip
    assert 1.45e9 < plan["parameters"] < 1.5e9  # OLMo-2-0425-1B's 1.48 B
    assert plan["total_gib"] < 0.85 * 78  # room for the CUDA context and the allocator on an 80 GB card


def test_the_modules_example_runs():
    result = doctest.testmod(memory_plan)
    assert result.attempted >= 2 and result.failed == 0
