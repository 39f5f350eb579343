import pytest
import torch

from lightning_unlearn.masks import (
    LazyMasks,
    coverage_by_group,
    default_exclusions,
    group_mask,
    load_masks,
    masked_parameter_names,
    sample_masks,
    save_masks,
    shard_masks,
    union_mask,
)
from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def test_default_exclusions_follow_the_paper(tiny_model):
    excluded = set(default_exclusions(tiny_model))
    assert "model.embed_tokens.weight" in excluded
    assert "model.norm.weight" in excluded
    assert "model.layers.0.input_layernorm.weight" in excluded
    assert "model.layers.2.mlp.down_proj.weight" in excluded  # last two of 4 blocks
    assert "model.layers.3.self_attn.q_proj.weight" in excluded
    included = set(masked_parameter_names(tiny_model))
    assert "model.layers.1.self_attn.q_proj.weight" in included
    assert "lm_head.weight" in included  # untied output head is a weight of θ_mask
    assert not included & excluded


def test_sampled_masks_are_packed_disjoint_and_cover_the_target(tiny_model):
    packed = sample_masks(tiny_model, num_groups=6, coverage=0.05, seed=3)
    included = masked_parameter_names(tiny_model)
    for name, t in packed.items():
        assert t.dtype == torch.uint32
        # no element has two bits set: the popcount of each value is 0 or 1
        ones = sum(group_mask(t, g).to(torch.int64) for g in range(32))
        assert int(ones.max()) <= 1, name
        if name not in included:
            assert int((t != 0).sum()) == 0, f"excluded {name} has bits set"
    cov = coverage_by_group(packed, 6, included)
    for c in cov:
        assert abs(c - 0.05) / 0.05 <= 0.10, cov


def test_sampling_is_deterministic_and_seed_dependent(tiny_model):
    a = sample_masks(tiny_model, 6, 0.05, seed=1)
    b = sample_masks(tiny_model, 6, 0.05, seed=1)
    c = sample_masks(tiny_model, 6, 0.05, seed=2)
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(a[name], b[name])
    assert not torch.equal(a[name], c[name])


def test_group_mask_decodes_bits_including_bit_31():
    packed = torch.tensor([0, 1, 2, 4, 2**31], dtype=torch.uint32)
    assert group_mask(packed, 0).tolist() == [False, True, False, False, False]
    assert group_mask(packed, [1, 2]).tolist() == [False, False, True, True, False]
    assert group_mask(packed, 31).tolist() == [False, False, False, False, True]
    with pytest.raises(ValueError, match="out of range"):
        group_mask(packed, 32)
    with pytest.raises(ValueError, match="out of range"):
        group_mask(packed, -1)


def test_bad_group_count_and_coverage_raise(tiny_model):
    with pytest.raises(ValueError, match="num_groups"):
        sample_masks(tiny_model, num_groups=33)
    with pytest.raises(ValueError, match="coverage"):
        sample_masks(tiny_model, num_groups=6, coverage=0.2)


def test_save_load_round_trip(tiny_model, tmp_path):
    packed = sample_masks(tiny_model, 6, 0.05, seed=0)
    path = tmp_path / "masks.safetensors"
    save_masks(path, packed, num_groups=6, coverage=0.05, seed=0, exclusions=default_exclusions(tiny_model))
    loaded, meta = load_masks(path, model=tiny_model)
    assert meta["num_groups"] == 6 and meta["coverage"] == 0.05 and meta["seed"] == 0
    assert "model.embed_tokens.weight" in meta["exclusions"]
    assert set(loaded) == set(packed)
    for n in packed:
        assert loaded[n].dtype == torch.uint32
        assert torch.equal(loaded[n], packed[n])
    assert not list(tmp_path.glob("*.tmp"))


def test_mismatched_model_raises_naming_the_parameter(tiny_model, tiny_tokenizer, tmp_path):
    packed = sample_masks(tiny_model, 6, 0.05, seed=0)
    path = tmp_path / "masks.safetensors"
    save_masks(path, packed)
    other = build_tiny_llama(tiny_tokenizer, TinyLlamaConfig(hidden_size=48, num_layers=4, num_heads=2))
    with pytest.raises(ValueError, match=r"masks do not match the model: 'model.embed_tokens.weight' has shape"):
        load_masks(path, model=other)
    deeper_config = TinyLlamaConfig(hidden_size=32, num_layers=5, num_heads=2, intermediate_size=64)
    deeper = build_tiny_llama(tiny_tokenizer, deeper_config)
    with pytest.raises(ValueError, match="model.layers.4"):
        load_masks(path, model=deeper)


def test_masks_follow_peft_wrapping(tiny_model):
    from lightning_unlearn.models import AdapterConfig, apply_adapter

    plain = sample_masks(tiny_model, 6, 0.05, seed=0)
    wrapped = apply_adapter(tiny_model, AdapterConfig(kind="lora", r=2, alpha=4))
    via_peft = sample_masks(wrapped, 6, 0.05, seed=0)
    assert set(via_peft) == set(plain)
    assert all(torch.equal(plain[n], via_peft[n]) for n in plain)


def test_shards_concatenate_to_the_full_mask(tiny_model):
    packed = sample_masks(tiny_model, 6, 0.05, seed=0)
    for world in (2, 3):
        shards = [shard_masks(packed, r, world) for r in range(world)]
        for n, t in packed.items():
            assert torch.equal(torch.cat([s[n] for s in shards], 0), t)


def test_lazy_masks_make_the_same_tensors_one_at_a_time(tiny_model, tiny_tokenizer, tmp_path):
    eager = sample_masks(tiny_model, 6, 0.05, seed=3)
    lazy = sample_masks(tiny_model, 6, 0.05, seed=3, lazy=True)
    assert isinstance(lazy, LazyMasks) and list(lazy) == list(eager)
    assert all(torch.equal(lazy[n], eager[n]) for n in eager)
    assert lazy["model.layers.0.mlp.up_proj.weight"] is not lazy["model.layers.0.mlp.up_proj.weight"]  # no cache
    assert coverage_by_group(lazy, 6) == coverage_by_group(eager, 6)
    shards = shard_masks(lazy, 1, 2)
    assert all(torch.equal(shards[n], torch.chunk(eager[n], 2, 0)[1]) for n in eager)
    # from a file: the header gives names and shapes (the model check reads no tensor); tensors on access
    path = tmp_path / "masks.safetensors"
    save_masks(path, eager)
    from_file, _ = load_masks(path, model=tiny_model, lazy=True)
    assert isinstance(from_file, LazyMasks) and from_file.shapes == {n: tuple(t.shape) for n, t in eager.items()}
    assert all(torch.equal(from_file[n], eager[n]) for n in eager)
    other = build_tiny_llama(tiny_tokenizer, TinyLlamaConfig(hidden_size=48, num_layers=4, num_heads=2))
    with pytest.raises(ValueError, match=r"'model.embed_tokens.weight' has shape"):
        load_masks(path, model=other, lazy=True)
    with pytest.raises(KeyError):
        lazy["no.such.weight"]


def test_lazy_union_mask_decodes_each_tensor_when_read(tiny_model, tmp_path):
    eager = sample_masks(tiny_model, 6, 0.05, seed=4)
    save_masks(tmp_path / "masks.safetensors", eager)
    packed, _ = load_masks(tmp_path / "masks.safetensors", lazy=True)
    forget = union_mask(packed, [0, 2], lazy=True)
    expected = union_mask(eager, [0, 2])
    assert isinstance(forget, LazyMasks) and forget.shapes == {n: tuple(t.shape) for n, t in eager.items()}
    assert all(torch.equal(forget[n], expected[n]) and forget[n].dtype == torch.bool for n in eager)
    assert sum(int(forget[n].sum()) for n in forget) > 0
    with pytest.raises(ValueError, match="group id 40 is out of range"):
        union_mask(packed, [0, 40], lazy=True)  # refused at once, not at the first read


def test_mask_groups_absent_from_an_export_or_shared_are_refused():
    """The default retain groups 3-5 on an export of three groups would score AUC(F|R) = AUC(F) without a word."""
    from lightning_unlearn.masks import check_mask_groups

    packed = {"w": torch.tensor([1, 2, 4, 0], dtype=torch.int32).view(torch.uint32)}  # groups 0, 1, 2
    with pytest.raises(ValueError, match=r"--retain_groups \[3, 4, 5\]: the masks 'm' hold groups 0–2 "
                                         r"\(num_groups 3\), not \[3, 4, 5\]"):  # fmt: skip
        check_mask_groups(packed, {"num_groups": 3}, (0, 1, 2), (3, 4, 5), "m")
    with pytest.raises(ValueError, match=r"hold groups \[0, 1, 2\], not \[3\]"):  # no metadata: read from the masks
        check_mask_groups(packed, {}, [0], [3], "m")
    with pytest.raises(ValueError, match=r"share group\(s\) \[1\]"):
        check_mask_groups(packed, {}, [0, 1], [1], "m")
    with pytest.raises(ValueError, match="--forget_groups is empty"):
        check_mask_groups(packed, {}, [], [1], "m")
    check_mask_groups(packed, {"num_groups": 3}, [0], [1, 2], "m")  # a valid choice passes
    check_mask_groups(packed, {}, [0, 2], [], "m")
