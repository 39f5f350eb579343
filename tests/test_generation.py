import pytest

from lightning_unlearn.generation import encode_prompts_left_padded, generate_greedy

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def test_left_padding_puts_prompts_at_the_end(tiny_tokenizer):
    ids, attn = encode_prompts_left_padded(tiny_tokenizer, ["Where was Alice born?", "Hi"])
    assert ids.shape == attn.shape and attn[:, -1].tolist() == [1, 1]
    assert attn[1, 0] == 0 and attn[0].all()
    assert ids[0, 0] == tiny_tokenizer.bos_token_id


def test_batched_generation_equals_one_prompt_at_a_time(tiny_model, tiny_tokenizer):
    prompts = ["Where was Alice Smith born?", "Python is", "What is the phone number of Bob Jones?"]
    batched = generate_greedy(tiny_model, tiny_tokenizer, prompts, max_new_tokens=8)
    single = [generate_greedy(tiny_model, tiny_tokenizer, [p], max_new_tokens=8)[0] for p in prompts]
    assert [g.text for g in batched] == [g.text for g in single]
    for g in batched:
        assert g.num_tokens <= 8
        assert g.hit_token_cap == (g.num_tokens == 8)


def test_matches_transformers_generate(tiny_model, tiny_tokenizer):

    prompts = ["Where was Alice Smith born?", "Python is"]
    ids, attn = encode_prompts_left_padded(tiny_tokenizer, prompts)
    ref = _plain_generate(tiny_model, tiny_tokenizer, ids, attn, 6)
    ref_text = [tiny_tokenizer.decode(r[ids.shape[1] :], skip_special_tokens=True).strip() for r in ref]
    ours = generate_greedy(tiny_model, tiny_tokenizer, prompts, max_new_tokens=6)
    assert [g.text for g in ours] == ref_text


def test_mixed_adapter_batches_give_each_adapter_its_own_answers(tiny_dir, tiny_tokenizer, tmp_path):
    """Three saved LoRA adapters answered in one pass (a block of rows per adapter) = each adapter alone."""
    from lightning_unlearn.generation import generate_sorted

    names = ["step2", "step4", "step6"]
    model = _three_adapters(tiny_dir, tmp_path, names)
    texts = ["Where was Alice Smith born?", "Python is", "What is the phone number of Bob Jones?", "The war"]
    mixed = generate_sorted(model, tiny_tokenizer, texts, max_new_tokens=8, batch_size=3, adapters=names)
    alone = {}
    for name in names:
        model.set_adapter(name)
        alone[name] = generate_sorted(model, tiny_tokenizer, texts, max_new_tokens=8, batch_size=3)
    assert mixed == alone
    assert len({tuple(a["answer"] for a in answers) for answers in alone.values()}) == 3  # the adapters differ


def _three_adapters(tiny_dir, tmp_path, names):
    """A peft model holding len(names) saved LoRA adapters of random non-zero weights."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    from lightning_unlearn.models import load_causal_lm

    for k, name in enumerate(names):
        torch.manual_seed(k)
        config = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "down_proj"],
                            init_lora_weights=False)  # fmt: skip
        get_peft_model(load_causal_lm(tiny_dir), config).save_pretrained(tmp_path / name)
    model = PeftModel.from_pretrained(load_causal_lm(tiny_dir), tmp_path / names[0], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(tmp_path / name, adapter_name=name)
    return model.eval()


def test_mixed_adapter_decoding_drops_a_prompt_once_every_adapter_has_ended(tiny_dir, tiny_tokenizer, tmp_path):
    """Prompts 0 and 1 end by their third token under every adapter (those tokens made end-of-sequence ids): their
    rows leave the batch while the others decode on, and every answer is still the adapter's own through HF
    ``generate``, cut where it ends."""

    names = ["step2", "step4", "step6"]
    model = _three_adapters(tiny_dir, tmp_path, names)
    texts = ["Where was Alice Smith born?", "Python is", "What is the phone number of Bob Jones?", "The war"]
    ids, attn = encode_prompts_left_padded(tiny_tokenizer, texts)
    stops = set()
    for name in names:
        model.set_adapter(name)
        out = _plain_generate(model, tiny_tokenizer, ids, attn, 3)
        stops |= {int(out[i, ids.shape[1] + 2]) for i in (0, 1)}  # fmt: skip
    model.generation_config.eos_token_id = [tiny_tokenizer.eos_token_id, *sorted(stops)]
    mixed, alone, shapes = _mixed_and_alone(model, tiny_tokenizer, texts, names, max_new_tokens=10)
    sizes = [rows for rows, _ in shapes]
    assert mixed == alone
    ended = [[g.num_tokens <= 3 and not g.hit_token_cap for g in alone[n]] for n in names]
    assert all(e[0] and e[1] for e in ended) and not all(all(e) for e in ended)
    assert sizes[0] == 3  # the prompts' shared BOS, once per adapter
    sizes = sizes[1:]
    assert sizes[0] == 12 and min(sizes) < 12 and all(s % 3 == 0 for s in sizes), sizes  # equal blocks, shrunk
    assert len(sizes) == max(g.num_tokens for gens in alone.values() for g in gens)  # a forward a token, no more


def test_prompts_shared_leading_tokens_are_computed_once_per_adapter(tiny_dir, tiny_tokenizer, tmp_path):
    """Prompts behind one long common preamble (a chat template's system turn): the preamble runs once per adapter,
    its cache rows are copied to every prompt, and every answer is still the adapter's own through HF ``generate``."""
    import torch

    from lightning_unlearn.generation import greedy_blocks

    names = ["step2", "step4"]
    model = _three_adapters(tiny_dir, tmp_path, names)
    preamble = "System: you are a helpful assistant who answers in one sentence. User: "
    texts = [preamble + q for q in ("Where was Alice Smith born?", "Python is", "Who wrote the report on the war?")]
    ids, attn = encode_prompts_left_padded(tiny_tokenizer, texts)
    shared = len(tiny_tokenizer(preamble)["input_ids"]) - 1  # with BOS; the last preamble token may merge
    mixed, alone, calls = _mixed_and_alone(model, tiny_tokenizer, texts, names, max_new_tokens=8)
    assert mixed == alone
    assert calls[0][0] == 2 and calls[0][1] >= shared  # the preamble, once for each of the two adapters
    assert calls[1] == (6, ids.shape[1] - calls[0][1])  # then every row's own tokens after it
    model.set_adapter(names[0])
    eos = [tiny_tokenizer.eos_token_id]
    assert greedy_blocks(model, ids, attn, eos, tiny_tokenizer.pad_token_id, 8) == greedy_blocks(
        model, ids, attn, eos, tiny_tokenizer.pad_token_id, 8, share_prefix=False
    )
    assert torch.equal(ids, encode_prompts_left_padded(tiny_tokenizer, texts)[0])  # the inputs are left as given


def test_a_prefix_store_runs_each_shared_leading_token_once_for_the_whole_pass(tiny_dir, tiny_tokenizer, tmp_path):
    """Batches of one pass behind one preamble: the first runs its shared prefix; a later batch whose prefix the kept
    one covers (shorter, or the same) runs none; a longer one runs only the tokens after the kept ones. Every answer
    is still each adapter's own through HF ``generate``."""
    from lightning_unlearn.generation import PrefixStore, _shared_prefix

    names = ["step2", "step4"]
    model = _three_adapters(tiny_dir, tmp_path, names)
    preamble = "System: you are a helpful assistant who answers in one sentence. User: "
    batches = [
        ["Where was Alice Smith born?", "Where was Bob Jones born?"],  # prefix: preamble + "Where was"
        ["Python is", "Who wrote the report on the war?"],  # shorter: covered by the first
        ["Where was Carol born?", "Where was Dan born?"],  # the same as the first
        ["Where was Alice Smith born? Say it", "Where was Alice Smith born? Tell me"],  # longer: extends it
    ]
    store, firsts = PrefixStore(), []
    for questions in batches:
        texts = [preamble + q for q in questions]
        mixed, alone, calls = _mixed_and_alone(model, tiny_tokenizer, texts, names, max_new_tokens=6, prefixes=store)
        assert mixed == alone
        ids, attn = encode_prompts_left_padded(tiny_tokenizer, texts)
        firsts.append((calls[0], _shared_prefix(ids, attn)))
    (first, shared0), (second, _), (third, _), (fourth, shared3) = firsts
    assert first == (2, shared0)  # the whole prefix, once per adapter
    assert second[0] == third[0] == 4  # no prefix forward: straight to the rows' own tokens
    assert shared3 > shared0 and fourth == (2, shared3 - shared0)  # only the tokens the kept prefix lacks
    assert len(store._kept) == 2  # the first prefix and its extension
    with pytest.raises(ValueError, match="one PrefixStore per set of adapters"):
        _mixed_and_alone(model, tiny_tokenizer, texts, names[::-1], max_new_tokens=6, prefixes=store)


def _mixed_and_alone(model, tokenizer, texts, names, max_new_tokens, prefixes=None):
    """Mixed-adapter answers (with the ``(rows, tokens)`` of every forward they took) and each adapter's alone."""
    from lightning_unlearn.generation import generate_greedy_adapters

    shapes = []
    hook = model.get_base_model().model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        mixed = generate_greedy_adapters(
            model, tokenizer, texts, names, max_new_tokens=max_new_tokens, prefixes=prefixes
        )
    finally:
        hook.remove()
    alone = {}
    for name in names:
        model.set_adapter(name)
        alone[name] = generate_greedy(model, tokenizer, texts, max_new_tokens=max_new_tokens)
    return mixed, alone, shapes


def _plain_generate(model, tokenizer, ids, attn, max_new_tokens):
    """HF ``generate``, greedy, the tokenizer's pad and EOS: the reference the project's decoding must match."""
    import torch

    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )


def test_preallocated_cache_holds_what_the_plain_cache_holds():
    """Written in place into buffers (regrown when a step overruns them), repeated and selected by batch row, the
    layers give the model the same keys and values as transformers' concatenating ``DynamicCache``."""
    import torch
    from transformers import DynamicCache

    from lightning_unlearn.generation import _preallocated_cache

    plain, ours = DynamicCache(), _preallocated_cache(5)  # room for 5 tokens: the third update overruns it
    gen = torch.Generator().manual_seed(0)
    steps = [(1, 3), (1, 1), (2, 2), (4, 1), (2, 1)]  # (batch rows, new positions): rows doubled twice, then 2 kept
    for k, (rows, positions) in enumerate(steps):
        if k in (2, 3):
            for cache in (plain, ours):
                cache.batch_repeat_interleave(2)
        if k == 4:
            for cache in (plain, ours):
                cache.batch_select_indices(torch.tensor([3, 0]))
        for layer in range(2):
            key = torch.randn(rows, 2, positions, 4, generator=gen)
            value = torch.randn(rows, 2, positions, 4, generator=gen)
            want = plain.update(key, value, layer)
            got = ours.update(key.clone(), value.clone(), layer)
            assert all(torch.equal(w, g) for w, g in zip(want, got))
    assert ours.get_seq_length() == plain.get_seq_length() == 8
    assert ours.layers[0].key_buffer.shape[-2] == 10  # the third update overran 5 positions: doubled, once
