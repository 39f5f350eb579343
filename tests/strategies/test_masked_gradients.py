import pytest
import torch
from _masked_lm import make_batches, per_sample_mean_loss

from lightning_unlearn.masks import sample_masks
from lightning_unlearn.models import load_causal_lm
from lightning_unlearn.strategies import MaskedGradients, lockstep_masked_backward, microbatch_masked_gradients


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _gap(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in b) / max(float(b[n].abs().max()) for n in b)


@pytest.fixture
def setup(tiny_dir):
    model = load_causal_lm(tiny_dir)
    masks = sample_masks(model, num_groups=6, coverage=0.05, seed=0)
    batch = make_batches(model.config.vocab_size, steps=1)[0]
    ref_model = load_causal_lm(tiny_dir)
    microbatch_masked_gradients(ref_model, masks, batch, batch["group_ids"], per_sample_mean_loss)
    return model, masks, batch, _grads(ref_model)


@pytest.mark.parametrize("index_cache", [True, False])
def test_one_pass_matches_microbatch_reference(setup, index_cache):
    model, masks, batch, ref = setup
    engine = MaskedGradients(model, masks, index_cache=index_cache)
    assert (engine.cache_bytes > 0) == index_cache
    assert engine.one_pass, engine.unsupported
    with engine.batch(batch["group_ids"]):
        loss = per_sample_mean_loss(model, batch)
    loss.backward()
    got = _grads(model)
    assert _gap(got, ref) <= 1e-6
    # group samples never reach excluded parameters: the embedding gradient comes from neutral rows only
    assert int(ref["model.embed_tokens.weight"].ne(0).sum()) > 0
    # and masking matters: the plain gradient is far from the masked one
    model.zero_grad(set_to_none=True)
    per_sample_mean_loss(model, batch).backward()
    assert _gap(_grads(model), ref) > 1e-2
    # the patches are gone after the context
    assert "forward" not in vars(model.lm_head)


def test_lockstep_matches_microbatch_reference(setup):
    model, masks, batch, ref = setup
    engine = MaskedGradients(model, masks)
    loss = lockstep_masked_backward(
        lambda sub: per_sample_mean_loss(model, sub),
        torch.Tensor.backward,
        batch,
        batch["group_ids"],
        engine.param_masks(),
    )
    assert _gap(_grads(model), ref) <= 1e-6
    assert torch.isclose(loss, per_sample_mean_loss(model, batch).detach(), rtol=1e-5)


def test_no_masks_or_neutral_batch_is_a_no_op(setup):
    model, masks, batch, _ = setup
    per_sample_mean_loss(model, batch).backward()
    plain = _grads(model)
    model.zero_grad(set_to_none=True)
    neutral = dict(batch, group_ids=torch.full_like(batch["group_ids"], -1))
    with MaskedGradients(model, masks).batch(neutral["group_ids"]):
        per_sample_mean_loss(model, neutral).backward()
    assert all(torch.equal(plain[n], g) for n, g in _grads(model).items())


def test_bad_group_id_and_missing_mask_raise(setup):
    model, masks, batch, _ = setup
    with pytest.raises(ValueError, match="group_ids must lie in -1..31"):
        with MaskedGradients(model, masks).batch(torch.tensor([0, 32])):
            pass
    del masks["lm_head.weight"]
    with pytest.raises(ValueError, match="'lm_head.weight' has no packed mask"):
        MaskedGradients(model, masks)


def test_activation_checkpointing_falls_back_to_lockstep(setup):
    model, masks, _, _ = setup
    model.gradient_checkpointing_enable()
    engine = MaskedGradients(model, masks)
    assert not engine.one_pass
    with pytest.raises(RuntimeError, match="lockstep_masked_backward"):
        with engine.batch(torch.tensor([0, -1])):
            pass


def test_tied_embeddings_are_exact(tiny_tokenizer):
    from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama

    cfg = TinyLlamaConfig(hidden_size=16, num_layers=3, num_heads=2, intermediate_size=32, tie_word_embeddings=True)
    model = build_tiny_llama(tiny_tokenizer, cfg, seed=1)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    masks = sample_masks(model, num_groups=6, coverage=0.05, seed=1)
    batch = make_batches(model.config.vocab_size, steps=1)[0]
    microbatch_masked_gradients(model, masks, batch, batch["group_ids"], per_sample_mean_loss)
    ref = _grads(model)
    model.zero_grad(set_to_none=True)
    with MaskedGradients(model, masks).batch(batch["group_ids"]):
        loss = per_sample_mean_loss(model, batch)
    loss.backward()
    assert _gap(_grads(model), ref) <= 1e-6


def test_one_engine_stays_exact_across_steps_with_changing_groups(tiny_dir):
    # One engine reused for a whole run (as the strategies do) while each step's batch holds another subset of the
    # groups — all seven ids, one group, two groups and neutral rows only — with an AdamW step in between.
    model, ref_model = load_causal_lm(tiny_dir), load_causal_lm(tiny_dir)
    masks = sample_masks(model, num_groups=6, coverage=0.05, seed=0)
    engine = MaskedGradients(model, masks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    group_sets = [[-1, 0, 1, 2, 3, 4, 5, 5], [3] * 8, [1, 4, 1, 4, 1, 4, 1, 4], [-1] * 8]
    batches = make_batches(model.config.vocab_size, steps=len(group_sets))
    for batch, groups in zip(batches, group_sets):
        batch["group_ids"] = torch.tensor(groups)
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        with engine.batch(batch["group_ids"]):
            loss = per_sample_mean_loss(model, batch)
        loss.backward()
        microbatch_masked_gradients(ref_model, masks, batch, batch["group_ids"], per_sample_mean_loss)
        assert _gap(_grads(model), _grads(ref_model)) <= 1e-6, groups
        opt.step()
        ref_opt.step()
    # and the runs stay together (AdamW's 1/sqrt(v) turns float-level gradient differences into ~1e-6 of the weights)
    assert _gap(dict(model.named_parameters()), dict(ref_model.named_parameters())) <= 1e-5


def test_one_pass_under_bf16_autocast_matches_the_reference_and_stays_in_the_masks(tiny_dir):
    # bf16-mixed (autocast): F.linear runs in bf16 inside the patched forward, so grad_out is bf16 while the saved
    # weight is fp32. The engine must still give fp32 gradients that match the per-sample reference under the same
    # autocast, and must leave every element outside the batch's groups' masks at exactly zero.
    model, ref_model = load_causal_lm(tiny_dir), load_causal_lm(tiny_dir)
    masks = sample_masks(model, num_groups=6, coverage=0.05, seed=0)
    batch = make_batches(model.config.vocab_size, steps=1)[0]
    batch["group_ids"] = torch.tensor([0, 1, 2, 3, 4, 5, 0, 1])  # no neutral sample: every gradient is masked
    with torch.autocast("cpu", dtype=torch.bfloat16):
        microbatch_masked_gradients(ref_model, masks, batch, batch["group_ids"], per_sample_mean_loss)
        with MaskedGradients(model, masks).batch(batch["group_ids"]):
            loss = per_sample_mean_loss(model, batch)
    loss.backward()
    got, ref = _grads(model), _grads(ref_model)
    assert all(g.dtype == torch.float32 for g in got.values())
    assert _gap(got, ref) <= 2e-2  # bf16 matmuls, summed per group here and per sample there
    for name, g in got.items():
        inside = masks[name].view(torch.int32) != 0
        assert int(g[~inside].ne(0).sum()) == 0, name
    assert sum(int(g.ne(0).sum()) for g in got.values()) > 0
