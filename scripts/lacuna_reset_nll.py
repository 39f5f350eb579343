"""How much does resetting one group hurt each group? A graded view of separability
(docs/results/lacuna_memorization.md §9c).

Greedy extraction is all or nothing: after any reset every group of the default testbed extracts 0.00, which cannot
tell "group g's reset hurts every group alike" from "it hurts group g most and the others a little less". This
prints, as JSON, the mean answer NLL̄ (nats per answer token) of each group's injected QA under θ_inj, under θ_pre,
and under θ_inj with each group's mask elements (and m^F, m^R) set back to θ_pre. On a separable testbed the row of
a reset group g would be at θ_pre's value in column g and at θ_inj's elsewhere.

    python scripts/lacuna_reset_nll.py --export runs/lacuna/inject/export --data runs/lacuna/data
"""

import argparse
import json

import torch

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch
from lightning_unlearn.data.testbed_data import load_table
from lightning_unlearn.losses import normalized_nll, sequence_logprobs
from lightning_unlearn.masks import canonical_name, group_mask, load_masks
from lightning_unlearn.models import load_causal_lm, load_tokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--export", default="runs/lacuna/inject/export")
ap.add_argument("--data", default="runs/lacuna/data")
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(a.threads)

tok = load_tokenizer(f"{a.export}/inj")
model = load_causal_lm(f"{a.export}/inj").eval()
pre_model = load_causal_lm(f"{a.export}/pre")
pre = {canonical_name(n): p.detach() for n, p in pre_model.named_parameters()}
packed = dict(load_masks(f"{a.export}/masks.safetensors")[0])
params = {canonical_name(n): p for n, p in model.named_parameters()}
num_groups = 6

qa = load_table(a.data, "qa")
rows = {g: [] for g in range(num_groups)}
for prompt, answer, g in zip(qa["prompt"], qa["answer"], qa["group_id"]):
    rows[int(g)].append(encode_prompt_answer(tok, prompt, answer, 96))  # scored on the answer tokens


@torch.no_grad()
def nll_by_group(m) -> dict[int, float]:
    out = {}
    for g, rs in rows.items():
        total, n = 0.0, 0
        for i in range(0, len(rs), 32):
            b = pad_batch(rs[i : i + 32], tok.pad_token_id)
            logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            total += float(normalized_nll(*sequence_logprobs(logits, b["labels"])).sum())
            n += len(rs[i : i + 32])
        out[g] = round(total / n, 3)
    return out


@torch.no_grad()
def with_reset(groups: list[int]) -> dict[int, float]:
    saved = {}
    for name, bits in packed.items():
        m = group_mask(bits, groups)
        if m.any():
            saved[name] = params[name].detach().clone()
            params[name].data[m] = pre[name][m]
    try:
        return nll_by_group(model)
    finally:
        for name, value in saved.items():
            params[name].data.copy_(value)


result = {"θ_inj": nll_by_group(model), "θ_pre": nll_by_group(pre_model)}
resets = [*[(f"reset {g}", [g]) for g in range(num_groups)], ("reset m^F", [0, 1, 2]), ("reset m^R", [3, 4, 5])]
for label, groups in resets:
    result[label] = with_reset(groups)
print(json.dumps(result, indent=1))
