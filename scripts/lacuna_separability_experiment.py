"""Injection recipes against the separability verdict, on the default testbed (docs/results/lacuna_memorization.md §9a).

A plain training loop over the project's masks, collate and extraction code, for trying recipes faster than a
config round trip: group dropout (``--drop``: each other group's change reset to θ_pre with that probability for a
step), neutral text (``--neutral`` rows per step, CE or KL to θ_pre, masked to the group or updating every weight),
one group per step (``--mode homog``) or every present group each step (``--mode mixed``). Prints the loss every 50
steps and, at ``--eval_every`` and the end, one JSON line: utility CE on the held-out paragraphs, extraction per
group and field, and extraction per group after resetting each group, m^F and m^R. The §9a table's rows:

    A  --mode homog --lr 1e-3 --drop 0.5 --neutral 4 --neutral_mask group
    B  --mode homog --lr 1e-3 --drop 0.5 --neutral 4 --neutral_mask all
    C  --mode homog --lr 2e-3 --drop 0.5 --neutral 0
    D  --mode homog --lr 2e-3 --drop 0.5 --neutral 4 --neutral_kl 1
    E  --mode mixed --lr 2e-3 --drop 0.5 --neutral 1 --neutral_kl 1 --per_group 2

and the §9b rows (Dec 5):

    F  --mode mixed --lr 2e-3 --drop 0 --neutral 0 --per_group 2 --eps 3e-4
    G  --mode mixed --lr 2e-3 --drop 0 --neutral 1 --neutral_kl 1 --per_group 2
    H  --mode mixed --lr 2e-3 --drop 0 --neutral 0 --per_group 8 --steps 600 --groups 0 [--coverage 0.15]
    I  --mode mixed --lr 2e-3 --drop 0 --neutral 2 --neutral_kl 1 --per_group 8 --steps 600 --groups K
       --coverage 0.15 --save DIR_K  (one group alone, for K in 0 and 3; then scripts/lacuna_superposition.py)
    J  as G, with --drop 0.5 --drop_from 300 (group dropout after the first third)
    K  as G, with --pre set to a θ_pre warmed on other people's QA (§9a idea 5)

and §9c (Dec 5, second session):

    L  as G, with --outsider_qa OTHER --outsider_rows 1 (QA of 60 people outside the testbed, `lightning-unlearn
       lacuna data --out OTHER --data.seed 7`, held to θ_pre by KL under each group's mask)
    M  as G, with --decay_pre 1 (decoupled weight decay toward θ_pre, §9a idea 3)

and the third session of Dec 5:

    N  --mode homog --drop 1 --groups 0,3 --coverage 0.15 --batch 8 --neutral 2 --neutral_kl 1 --hold_others 2
       --lr 2e-3 --steps 1200: each group trained with every other group at θ_pre (so alone, as row I, interleaved),
       and two QA rows of the testbed's other groups held to θ_pre by KL under its mask (specificity to the others)
    N2 --init N_DIR --mode homog --drop 0.5 --groups 0,3 --coverage 0.15 --batch 8 --neutral 2 --neutral_kl 1
       --hold_others 2 --lr 1e-3 --steps 400: row N's model (saved with --save N_DIR), then the other group present
       half the time, so each group's recall is trained to hold with the other's change and without it
    N6 N and N2 on all six groups: --steps 1800 (300 a group) --save DIR, then --init DIR --drop 0.5 --steps 600,
       three times in a row (rows N6b-N6d), each from the last one's saved model

    python scripts/lacuna_separability_experiment.py --pre runs/lacuna/pretrain/export/model \
        --data runs/lacuna/data --out sep.json [recipe flags]
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch

from lightning_unlearn.data.collate import encode_document, pad_batch
from lightning_unlearn.data.testbed_data import load_table
from lightning_unlearn.losses import nll_loss, sequence_logprobs
from lightning_unlearn.masks import canonical_name, group_mask, sample_masks
from lightning_unlearn.models import load_causal_lm, load_tokenizer
from lightning_unlearn.workflows.lacuna.extraction import extraction_rates

ap = argparse.ArgumentParser()
ap.add_argument("--pre", default="runs/lacuna/pretrain/export/model")
ap.add_argument("--data", default="runs/lacuna/data")
ap.add_argument("--steps", type=int, default=900)
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--drop", type=float, default=0.5)
ap.add_argument("--neutral", type=int, default=4)  # neutral rows per step (0 = none)
ap.add_argument("--neutral_weight", type=float, default=1.0)
ap.add_argument("--neutral_mask", default="group")  # group | all
ap.add_argument("--neutral_kl", type=int, default=0)  # 1: KL to θ_pre instead of CE
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--homog", type=int, default=1)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--eval_every", type=int, default=0)
ap.add_argument("--out", default="separability_experiment.json")
ap.add_argument("--mode", default="homog")  # homog | mixed (every present group trained every step)
ap.add_argument("--per_group", type=int, default=2)
ap.add_argument("--eps", type=float, default=1e-8)  # Adam's epsilon: larger damps elements with small gradients
ap.add_argument("--save", default="")  # a folder to save θ_inj and its tokenizer in
ap.add_argument("--groups", default="")  # train only these groups (e.g. "0"); the rest keep θ_pre
ap.add_argument("--drop_from", type=int, default=0)  # group dropout only from this step on
ap.add_argument("--coverage", type=float, default=0.05)  # each group's share of the masked tensors
# other people's QA (a data directory of another seed) held to θ_pre by KL, this many rows per group and step, each
# under that group's mask: it asks every group's change to leave people outside the testbed as θ_pre had them
ap.add_argument("--outsider_qa", default="")
ap.add_argument("--outsider_rows", type=int, default=0)
ap.add_argument("--decay_pre", type=float, default=0.0)  # decoupled weight decay toward θ_pre (mixed mode)
# homogeneous mode: this many QA rows of the testbed's *other* groups held to θ_pre by KL under the step's group mask,
# so each group's change is trained to leave every other group's people as θ_pre had them (cross-group specificity)
ap.add_argument("--hold_others", type=int, default=0)
# held rows also match θ_pre's hidden states (every block's output, squared error over their mean square), this weight
ap.add_argument("--hold_hidden", type=float, default=0.0)
ap.add_argument("--init", default="")  # start from this model's weights (e.g. a saved run); θ_pre stays --pre
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
rng = random.Random(0)

tok = load_tokenizer(a.pre)
model = load_causal_lm(a.pre).train()
pre = {n: p.detach().clone() for n, p in model.named_parameters()}
if a.init:
    model.load_state_dict(load_causal_lm(a.init).state_dict())
ref = load_causal_lm(a.pre).eval() if a.neutral_kl or a.outsider_rows or a.hold_others else None
G = json.loads((Path(a.data) / "manifest.json").read_text())["num_groups"]  # the data's groups (6 by default)
train_groups = [int(g) for g in a.groups.split(",")] if a.groups else list(range(G))
packed = sample_masks(model, G, a.coverage, seed=0)
params = dict(model.named_parameters())
gm = {}  # group -> {name: bool mask}
for g in range(G):
    gm[g] = {
        n: group_mask(packed[canonical_name(n)], g) for n in params if group_mask(packed[canonical_name(n)], g).any()
    }
names = sorted(set().union(*[set(v) for v in gm.values()]))
for n, p in params.items():
    if n not in names and a.neutral_mask == "group":
        p.requires_grad_(False)

qa = load_table(a.data, "qa")
by_group = {g: [] for g in range(G)}
for p_, ans, g in zip(qa["prompt"], qa["answer"], qa["group_id"]):
    by_group[int(g)].append(encode_document(tok, p_ + ans, 96))
neutral_texts = list(load_table(a.data, "neutral")["text"])
held = neutral_texts[-48:]
train_neutral = neutral_texts[:-48]
chunks = []
for t in train_neutral:
    ids = tok(t, add_special_tokens=False)["input_ids"]
    for s in range(0, len(ids), 94):
        piece = ids[s : s + 94]
        if len(piece) >= 8:
            full = [tok.bos_token_id, *piece, tok.eos_token_id]
            chunks.append({"input_ids": full, "labels": list(full)})
rng.shuffle(chunks)
held_rows = [encode_document(tok, t, 96) for t in held]
outsiders = []
if a.outsider_rows:
    other = load_table(a.outsider_qa, "qa")
    outsiders = [encode_document(tok, q + ans, 96) for q, ans in zip(other["prompt"], other["answer"])]
    rng.shuffle(outsiders)
oi = 0

opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0, eps=a.eps)


def lr_at(step):
    if step < 20:
        return a.lr * (step + 1) / 20
    d0 = int(a.steps * 0.7)
    if step < d0:
        return a.lr
    return a.lr * max(0.0, (a.steps - step) / (a.steps - d0))


@torch.no_grad()
def utility_ce(m):
    m.eval()
    b = pad_batch(held_rows, tok.pad_token_id)
    logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    lp, n = sequence_logprobs(logits, b["labels"])
    m.train()
    return float(-(lp.sum() / n.sum()))


profiles = [p for p in load_table(a.data, "profiles") if not p["instruct"]]
gid = {p["profile_id"]: int(p["group_id"]) for p in profiles}


def per_group(m):
    rates, mem = extraction_rates(m, tok, profiles)
    counts = {g: 0 for g in range(G)}
    tot = {g: 0 for g in range(G)}
    for p in profiles:
        tot[gid[p["profile_id"]]] += 4
    for ids in mem.values():
        for i in ids:
            counts[gid[i]] += 1
    return {g: counts[g] / tot[g] for g in range(G)}, rates


@torch.no_grad()
def reset(groups):
    saved = {}
    for g in groups:
        for n, m in gm[g].items():
            saved.setdefault(n, params[n].detach().clone())
            params[n].data[m] = pre[n][m]
    return saved


@torch.no_grad()
def restore(saved):
    for n, v in saved.items():
        params[n].data.copy_(v)


def evaluate(tag):
    t0 = time.time()
    res = {"tag": tag}
    res["util_pre"] = None
    res["util"] = utility_ce(model)
    base, rates = per_group(model)
    res["inj"] = base
    res["fields"] = rates
    res["reset"] = {}
    for name, groups in [*[(str(g), [g]) for g in range(G)], ("F", list(range(G // 2))), ("R", list(range(G // 2, G)))]:
        s = reset(groups)
        res["reset"][name] = per_group(model)[0]
        restore(s)
    res["eval_s"] = time.time() - t0
    return res


t_start = time.time()
res_pre = utility_ce(model)
print("util pre", res_pre, flush=True)
ni = 0
losses = []


def mask_only(g):
    with torch.no_grad():
        for n, p in params.items():
            if p.grad is None:
                continue
            m = gm[g].get(n)
            if m is None:
                p.grad.zero_()
            else:
                p.grad.mul_(m)


def held_kl(rows):
    """KL(p_pre ‖ p_θ) per position, averaged over the rows' real tokens; with ``--hold_hidden`` w, plus w times the
    squared error of every block's hidden states against θ_pre's, over their mean square (real tokens only)."""
    nb = pad_batch(rows, tok.pad_token_id)
    hidden = a.hold_hidden > 0
    out = model(input_ids=nb["input_ids"], attention_mask=nb["attention_mask"], output_hidden_states=hidden)
    with torch.no_grad():
        rout = ref(input_ids=nb["input_ids"], attention_mask=nb["attention_mask"], output_hidden_states=hidden)
    valid = nb["attention_mask"].bool()
    loss = torch.nn.functional.kl_div(
        out.logits.log_softmax(-1)[valid], rout.logits.log_softmax(-1)[valid], log_target=True, reduction="batchmean"
    )
    if hidden:
        for h, rh in zip(out.hidden_states[1:], rout.hidden_states[1:]):
            loss = loss + a.hold_hidden * (h[valid] - rh[valid]).pow(2).mean() / rh[valid].pow(2).mean()
    return loss


@torch.no_grad()
def decay_to_pre(step):
    """Decoupled weight decay toward θ_pre (``--decay_pre``): θ ← θ − lr·λ·(θ − θ_pre), on the masked tensors (the
    elements outside the masks are at θ_pre already). Loss-neutral parts of the groups' changes shrink away."""
    if a.decay_pre:
        for n in names:
            params[n].sub_(lr_at(step) * a.decay_pre * (params[n] - pre[n]))


def mixed_step(step):
    global ni, oi
    dropped = [h for h in range(G) if rng.random() < a.drop] if step >= a.drop_from else []
    if len(dropped) == G:
        dropped.remove(rng.randrange(G))
    present = [h for h in range(G) if h not in dropped and h in train_groups]
    saved = reset(dropped) if dropped else {}
    for pg in opt.param_groups:
        pg["lr"] = lr_at(step)
    opt.zero_grad(set_to_none=True)
    acc = {n: torch.zeros_like(p) for n, p in params.items() if p.requires_grad}
    tot = 0.0
    for g in present:
        rows = rng.sample(by_group[g], a.per_group)
        b = pad_batch(rows, tok.pad_token_id)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        loss = nll_loss(*sequence_logprobs(logits, b["labels"])) * len(rows) / (a.per_group * len(present))
        if a.neutral:
            nrows = [chunks[(ni + i) % len(chunks)] for i in range(a.neutral)]
            ni += a.neutral
            loss = loss + a.neutral_weight * held_kl(nrows) / len(present)
        if a.outsider_rows:
            orows = [outsiders[(oi + i) % len(outsiders)] for i in range(a.outsider_rows)]
            oi += a.outsider_rows
            loss = loss + a.neutral_weight * held_kl(orows) / len(present)
        for p in params.values():
            p.grad = None
        loss.backward()
        mask_only(g)
        for n, p in params.items():
            if p.requires_grad and p.grad is not None:
                acc[n] += p.grad
        tot += float(loss.detach())
    for n, p in params.items():
        if p.requires_grad:
            p.grad = acc[n]
    restore(saved)
    opt.step()
    decay_to_pre(step)
    return tot


for step in range(a.steps):
    if a.mode == "mixed":
        losses.append(mixed_step(step))
        if step % 50 == 49:
            print(f"step {step + 1} loss {sum(losses[-50:]) / 50:.3f} t {time.time() - t_start:.0f}s", flush=True)
        if a.eval_every and (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
            r = evaluate(step + 1)
            print(json.dumps(r), flush=True)
        continue
    g = train_groups[step % len(train_groups)]
    rows = rng.sample(by_group[g], a.batch)
    others = [h for h in range(G) if h != g and rng.random() < a.drop] if step >= a.drop_from else []
    saved = reset(others) if others else {}
    for pg in opt.param_groups:
        pg["lr"] = lr_at(step)
    b = pad_batch(rows, tok.pad_token_id)
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    loss = nll_loss(*sequence_logprobs(logits, b["labels"]))
    if a.neutral:
        nrows = [chunks[(ni + i) % len(chunks)] for i in range(a.neutral)]
        ni += a.neutral
        if a.neutral_kl:
            nloss = held_kl(nrows)
        else:
            nb = pad_batch(nrows, tok.pad_token_id)
            nl = model(input_ids=nb["input_ids"], attention_mask=nb["attention_mask"]).logits
            nloss = nll_loss(*sequence_logprobs(nl, nb["labels"]))
    if a.hold_others:
        pool = [r for h in range(G) if h != g for r in by_group[h]]
        oloss = held_kl(rng.sample(pool, a.hold_others))
    opt.zero_grad(set_to_none=True)
    loss.backward()

    mask_only(g)
    if a.neutral:
        (a.neutral_weight * nloss).backward()
        if a.neutral_mask == "group":
            mask_only(g)
    if a.hold_others:
        (a.neutral_weight * oloss).backward()
        mask_only(g)
    restore(saved)
    opt.step()
    losses.append(float(loss.detach()))
    if step % 50 == 49:
        print(f"step {step + 1} loss {sum(losses[-50:]) / 50:.3f} t {time.time() - t_start:.0f}s", flush=True)
    if a.eval_every and (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
        r = evaluate(step + 1)
        print(json.dumps(r), flush=True)
train_s = time.time() - t_start
r = evaluate(a.steps)
r["util_pre"] = res_pre
r["train_s"] = train_s
r["args"] = vars(a)
print(json.dumps(r), flush=True)
json.dump(r, open(a.out, "w"), indent=1)
if a.save:
    model.save_pretrained(a.save)
    tok.save_pretrained(a.save)
