"""Do single-group injections superpose? (docs/results/lacuna_memorization.md §9b)

Each model given was injected from the same θ_pre with one group's mask only (``lacuna_separability_experiment.py
--groups K --save DIR``), so its change Δ_K is θ_K − θ_pre. This prints, as JSON, the extraction per group of
θ_pre + Δ_K for each model alone, of θ_pre + ΣΔ_K, and of the sum without each one. If the groups superposed, the sum
would extract each group as its own model does, and removing Δ_K would forget group K only.

    python scripts/lacuna_superposition.py --pre runs/lacuna/pretrain/export/model --data runs/lacuna/data \\
        --models G0_DIR G3_DIR
"""

import argparse
import json

import torch

from lightning_unlearn.data.testbed_data import load_table
from lightning_unlearn.models import load_causal_lm, load_tokenizer
from lightning_unlearn.workflows.lacuna.extraction import extraction_rates

ap = argparse.ArgumentParser()
ap.add_argument("--pre", default="runs/lacuna/pretrain/export/model")
ap.add_argument("--data", default="runs/lacuna/data")
ap.add_argument("--models", nargs="+", required=True)
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(a.threads)

tok = load_tokenizer(a.pre)
model = load_causal_lm(a.pre).eval()
params = dict(model.named_parameters())
pre = {n: p.detach().clone() for n, p in params.items()}
deltas = {}
for d in a.models:
    single = dict(load_causal_lm(d).named_parameters())
    deltas[d] = {n: single[n].detach() - pre[n] for n in pre if not torch.equal(single[n].detach(), pre[n])}
profiles = [p for p in load_table(a.data, "profiles") if not p["instruct"]]
group_of = {p["profile_id"]: int(p["group_id"]) for p in profiles}
groups = sorted(set(group_of.values()))


def per_group():
    _, memorized = extraction_rates(model, tok, profiles)
    hits = dict.fromkeys(groups, 0)
    for ids in memorized.values():
        for i in ids:
            hits[group_of[i]] += 1
    fields = len(memorized)
    return {g: round(hits[g] / (fields * sum(v == g for v in group_of.values())), 3) for g in groups}


@torch.no_grad()
def set_to(models):
    for n, p in params.items():
        p.copy_(pre[n])
    for d in models:
        for n, delta in deltas[d].items():
            params[n].add_(delta)


result = {}
for d in a.models:
    set_to([d])
    result[f"alone {d}"] = per_group()
set_to(a.models)
result["sum"] = per_group()
for d in a.models:
    set_to([m for m in a.models if m != d])
    result[f"sum without {d}"] = per_group()
print(json.dumps(result, indent=1))
