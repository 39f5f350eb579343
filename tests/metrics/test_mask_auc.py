import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from sklearn.metrics import roc_auc_score

from lightning_unlearn.masks import load_masks, save_masks, union_mask
from lightning_unlearn.metrics.mask_auc import exact_auc, mask_auc, quantile_rank, weight_features

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)


def test_exact_auc_hand_computed_with_ties():
    # pos {0.9, 0.5} vs neg {0.5, 0.1}: 3 wins + 1 tie of 4 pairs = 0.875, whichever class is the minority.
    s = torch.tensor([0.9, 0.5, 0.5, 0.1])
    y = torch.tensor([True, True, False, False])
    assert exact_auc([(s, y)]) == pytest.approx(0.875)
    s3 = torch.tensor([0.9, 0.5, 0.5, 0.1, 0.95])
    y3 = torch.tensor([True, True, False, False, True])  # positives are the majority here
    assert exact_auc([(s3, y3)]) == pytest.approx(5.5 / 6)
    assert math.isnan(exact_auc([(s, torch.ones(4, dtype=torch.bool))]))


def test_exact_auc_counts_ties_as_one_half_exactly():
    # pos {1, 2, 3} vs neg {0, 1, 2, 2}: p=1 beats 0, ties 1; p=2 beats 0, 1, ties 2, 2; p=3 beats all four.
    # 7 wins + 3 ties of 12 pairs: (7 + 1.5) / 12.
    s = torch.tensor([1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 2.0])
    y = torch.tensor([1, 1, 1, 0, 0, 0, 0])
    assert exact_auc([(s, y)]) == 8.5 / 12
    # The same pairs from the other side (positives now the majority): 2 wins + 3 ties of 12.
    assert exact_auc([(s, 1 - y)]) == 3.5 / 12
    # Split over chunks, numpy inputs, one query per search: the same counts.
    parts = [(s[:2].numpy(), y[:2].numpy()), (s[2:5].numpy(), y[2:5].numpy()), (s[5:].numpy(), y[5:].numpy())]
    assert exact_auc(parts, chunk_size=1) == 8.5 / 12
    assert exact_auc([(torch.full((9,), 0.3), torch.arange(9) < 4)]) == 0.5  # every pair a tie
    assert exact_auc([(torch.arange(6.0), torch.arange(6) >= 2)]) == 1.0
    assert exact_auc([(-torch.arange(6.0), torch.arange(6) >= 2)], chunk_size=1) == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_exact_auc_matches_sklearn_on_integer_scores(seed):
    # Few distinct values, so most pairs tie; the class sizes vary from 1 positive to nearly all.
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 400, (1,), generator=g))
    y = torch.rand(n, generator=g) < [0.01, 0.3, 0.5, 0.7, 0.95, 0.2][seed]
    y[0], y[1] = True, False
    s = torch.randint(0, 1 + seed, (n,), generator=g).to(torch.float64) + 0.25 * y
    chunks = lambda: ((s[i : i + 37], y[i : i + 37]) for i in range(0, n, 37))  # noqa: E731
    assert exact_auc(chunks, chunk_size=16) == pytest.approx(roc_auc_score(y.numpy(), s.numpy()), abs=1e-12)


def test_exact_auc_refuses_nan_and_counts_that_do_not_match():
    y = torch.tensor([True, False, False])
    for at in range(3):  # a NaN in either class
        s = torch.tensor([0.5, 0.2, 0.1])
        s[at] = math.nan
        with pytest.raises(ValueError, match="NaN"):
            exact_auc([(s, y)])
    s = torch.tensor([0.5, 0.2, 0.1])
    with pytest.raises(ValueError, match="class_counts"):
        exact_auc([(s, y)], class_counts=(2, 1))
    with pytest.raises(ValueError, match="class_counts"):
        exact_auc([(s, y)], class_counts=(1, 3))
    with pytest.raises(ValueError, match="labels"):
        exact_auc([(s, y[:2])])


def _spill_cases():
    rng = np.random.default_rng(0)
    n = 3_000
    zeros = rng.choice(np.array([0.0, -0.0, 1.0], dtype=np.float32), size=n)
    return {
        "float32": rng.normal(size=n).astype(np.float32),
        # most scores exactly ±0 (a sparse injection's signrev): one bin beyond any small budget, split again
        "float32 ties, -0.0 = +0.0": rng.integers(-3, 4, size=n).astype(np.float32) * zeros,
        "float16": rng.normal(size=n).astype(np.float16),  # 16-bit keys: every bin is one value
        "int8": rng.integers(-5, 5, size=n).astype(np.int8),
        "float64": rng.normal(size=n) * rng.integers(0, 2, size=n),
    }


@pytest.mark.parametrize("case", list(_spill_cases()))
def test_spilled_exact_auc_counts_the_same_pairs_within_its_budget(case, tmp_path, monkeypatch):
    from lightning_unlearn.metrics.mask_auc import _SpilledScores

    s = _spill_cases()[case]
    y = np.random.default_rng(1).random(s.size) < 0.3
    chunks = [(s[i : i + 700], y[i : i + 700]) for i in range(0, s.size, 700)]
    held = exact_auc(chunks)
    assert held == pytest.approx(roc_auc_score(y, s.astype(np.float64)), abs=1e-12)
    runs = []
    run = _SpilledScores._run
    monkeypatch.setattr(_SpilledScores, "_run", lambda self, *a: runs.append(a[-2] + a[-1]) or run(self, *a))
    for budget_keys in (2, 37, 2_999):
        runs.clear()
        itemsize = max(s.itemsize, 2)
        spilled = exact_auc(chunks, max_buffer_bytes=budget_keys * itemsize, spill_dir=tmp_path, chunk_size=16)
        assert spilled == held  # the same integer count of wins and ties
        assert all(size <= budget_keys for size in runs)  # no run held more keys than the budget
        assert list(tmp_path.iterdir()) == []  # the spill is removed
    if case in ("float32", "float64"):  # distinct values: more than one run read back and sorted
        assert len(runs) > 1
    runs.clear()
    assert exact_auc(chunks, max_buffer_bytes=s.size * max(s.itemsize, 2)) == held and not runs  # fits: no spill


def test_spilled_exact_auc_refuses_nan_and_counts_that_do_not_match(tmp_path):
    s, y = np.array([0.5, 0.2, np.nan, 0.1], dtype=np.float32), np.array([True, False, False, True])
    with pytest.raises(ValueError, match="NaN"):
        exact_auc([(s, y)], max_buffer_bytes=4, spill_dir=tmp_path)
    s[2] = 0.3
    with pytest.raises(ValueError, match="class_counts"):
        exact_auc([(s, y)], class_counts=(1, 3), max_buffer_bytes=4, spill_dir=tmp_path)
    with pytest.raises(ValueError, match="class_counts"):
        exact_auc([(s, y)], class_counts=(2, 3), max_buffer_bytes=4, spill_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing left behind by a refused call


@pytest.mark.parametrize("positive_rate", [0.15, 0.8])
def test_exact_auc_matches_sklearn_on_1e5_weights(positive_rate):
    g = torch.Generator().manual_seed(0)
    y = torch.rand(100_000, generator=g) < positive_rate
    s = torch.round(torch.randn(100_000, generator=g) * 20 + y * 3) / 20  # rounded: many ties
    chunks = [(s[i : i + 7_000], y[i : i + 7_000]) for i in range(0, 100_000, 7_000)]
    ours = exact_auc(chunks, chunk_size=5_000)
    assert ours == pytest.approx(roc_auc_score(y.numpy(), s.numpy()), abs=1e-6)


def test_exact_auc_matches_sklearn_on_1e7_weights():
    g = torch.Generator().manual_seed(1)
    n = 10_000_000
    y = torch.rand(n, generator=g) < 0.15
    s = torch.randn(n, generator=g) + 0.5 * y
    sizes = [4_000_000, 3_000_000, 2_000_000, 1_000_000]
    parts = list(zip(torch.split(s, sizes), torch.split(y, sizes)))
    ours = exact_auc(parts)  # its speed is benchmarks/mask_auc.py's to measure, not a timed test's
    assert ours == pytest.approx(roc_auc_score(y.numpy(), s.numpy()), abs=1e-6)


def test_composite_auc_is_the_out_of_fold_auc_of_the_scaled_logistic_pipeline():
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from lightning_unlearn.metrics.mask_auc import composite_auc

    rng = np.random.default_rng(3)
    y = rng.random(3_000) < 0.2
    x = rng.normal(size=(3_000, 4)) * [1.0, 10.0, 0.1, 5.0] + y[:, None] * [0.5, 0.0, 0.05, -2.0]
    kept = x.copy()
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    cv = StratifiedKFold(n_splits=5, shuffle=True, random_state=7)
    proba = cross_val_predict(pipeline, x, y, cv=cv, method="predict_proba")[:, 1]
    assert composite_auc(x, y, folds=5, seed=7) == pytest.approx(roc_auc_score(y, proba), abs=1e-15)
    assert np.array_equal(x, kept)  # each fold scales its own copy
    assert math.isnan(composite_auc(x[:20], np.arange(20) < 3, folds=5))  # fewer positives than folds


def test_quantile_rank_averages_ties():
    q = quantile_rank(torch.tensor([1.0, 3.0, 3.0, 2.0]))
    assert torch.allclose(q, torch.tensor([0.0, 2.5 / 3, 2.5 / 3, 1.0 / 3]))


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1 << 20])
def test_quantile_rank_equals_scipy_average_ranks_whatever_the_chunks(chunk_size):
    """Tie runs that cross chunk ends get the same average rank as inside one chunk (scipy's ``rankdata``)."""
    from scipy.stats import rankdata

    g = torch.Generator().manual_seed(0)
    for x in (torch.randint(0, 9, (5, 41), generator=g).float(), torch.randn(203, generator=g)):
        expected = (rankdata(x.reshape(-1).numpy(), method="average") - 1) / (x.numel() - 1)
        assert torch.equal(quantile_rank(x, chunk_size=chunk_size), torch.from_numpy(expected).float().view_as(x))


def test_weight_features_hand_computed():
    pre, inj, unl, ctrl = torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([0.25]), torch.tensor([0.25])
    f = {
        name: float(weight_features(name, pre, inj, unl, ctrl, component_std=0.5))
        for name in ("raw", "layernorm", "signrev", "reversal", "dirreversal", "contrast", "contrastnorm", "compnorm")
    }
    # Δ_inj = 1, Δ_unl = -0.75, |θ_unl - θ_pre| = 0.25, Δ_unmask = 0.25.
    assert f["raw"] == pytest.approx(0.75)
    assert f["layernorm"] == pytest.approx(1.5)
    assert f["signrev"] == pytest.approx(0.75)
    assert f["reversal"] == pytest.approx(0.75)
    assert f["dirreversal"] == pytest.approx(0.75)
    assert f["contrast"] == pytest.approx(0.5)
    assert f["contrastnorm"] == pytest.approx(0.5)
    assert f["compnorm"] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="control"):
        weight_features("contrast", pre, inj, unl)


def test_weight_features_leave_their_inputs_untouched():
    # The families compute in place on fresh tensors; float32 inputs are not copied by .float(), so check them.
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(20, 5, generator=g) for _ in range(4)]
    copies = [t.clone() for t in inputs]
    for family in ("raw", "qtile", "layernorm", "signrev", "reversal", "dirreversal", "contrast", "contrastnorm",
                   "compnorm"):  # fmt: skip
        weight_features(family, *inputs, component_std=0.5)
    assert all(torch.equal(a, b) for a, b in zip(inputs, copies))


def _synthetic(n_tensors=3, shape=(60, 50), seed=0, localized=True):
    g = torch.Generator().manual_seed(seed)
    pre, inj, unl, forget, retain, ctrl = {}, {}, {}, {}, {}, {}
    for i in range(n_tensors):
        name = f"model.layers.{i}.mlp.down_proj.weight"
        u = torch.rand(shape, generator=g)
        forget[name], retain[name] = u < 0.15, (u >= 0.15) & (u < 0.3)
        pre[name] = torch.randn(shape, generator=g)
        # Injection moves every weight (neutral samples update all of θ), masked ones more.
        d_inj = torch.randn(shape, generator=g) * 0.01 * (1 + 2 * (forget[name] | retain[name]))
        inj[name] = pre[name] + d_inj
        noise = torch.randn(shape, generator=g) * 1e-3
        unl[name] = inj[name] + noise - (0.8 * d_inj * forget[name] if localized else 0)
        ctrl[name] = torch.randn(shape, generator=g) * 1e-3
    return pre, inj, unl, forget, retain, ctrl


def test_mask_auc_families_match_sklearn_and_localized_change_scores_high():
    pre, inj, unl, forget, retain, ctrl = _synthetic()
    unified = {n: forget[n] | retain[n] for n in forget}
    r = mask_auc(pre, inj, unl, forget, control=ctrl, unified_mask=unified, max_samples=5_000)
    names = list(forget)
    y = torch.cat([forget[n].reshape(-1) for n in names]).numpy()
    raw = torch.cat([(unl[n] - inj[n]).abs().reshape(-1) for n in names]).numpy()
    assert r["F"]["raw"] == pytest.approx(roc_auc_score(y, raw), abs=1e-6)
    sr = torch.cat([(-(inj[n] - pre[n]) * (unl[n] - inj[n])).reshape(-1) for n in names]).numpy()
    assert r["F"]["signrev"] == pytest.approx(roc_auc_score(y, sr), abs=1e-6)
    assert set(r["F"]) >= {
        "raw",
        "qtile",
        "layernorm",
        "signrev",
        "reversal",
        "dirreversal",
        "contrast",
        "contrastnorm",
        "compnorm",
        "composite",
        "max",
        "best",
    }
    assert r["F"]["signrev"] > 0.95 and r["F"]["composite"] > 0.95
    assert r["F"]["max"] == max(v for k, v in r["F"].items() if k not in ("max", "best"))
    # Retain-group weights were injected but not reversed: under the unified label they count as positives
    # that reversal scores miss, so AUC(F|R) is lower.
    assert r["F|R"]["signrev"] < r["F"]["signrev"]
    assert r["num_weights"] == 3 * 3000 and r["num_subsampled"] == 5_000
    assert r["num_positive"]["F"] == sum(int(forget[n].sum()) for n in names)


def test_mask_auc_without_control_omits_contrast_and_unlocalized_change_is_chance():
    pre, inj, unl, forget, *_ = _synthetic(localized=False)
    r = mask_auc(pre, inj, unl, forget, max_samples=3_000)
    assert "contrast" not in r["F"] and "F|R" not in r
    assert abs(r["F"]["raw"] - 0.5) < 0.05
    assert r["F"]["max"] < 0.6


def test_an_injection_that_moved_only_masked_weights_is_flagged():
    pre, inj, unl, forget, retain, _ = _synthetic(localized=False)
    assert mask_auc(pre, inj, unl, forget, composite=False)["warnings"] == []
    # No neutral text: Δ_inj is exactly 0 outside the six masks. An unlearning change that ignores the masks
    # (pure noise) then still "finds" the forget mask through `reversal`, which divides by |Δ_inj| + ε.
    masked_inj = {n: torch.where(forget[n] | retain[n], inj[n], pre[n]) for n in pre}
    unl = {n: masked_inj[n] + (unl[n] - inj[n]) for n in pre}  # the same noise on top
    inj = masked_inj
    r = mask_auc(pre, inj, unl, forget, composite=False)
    assert r["inj_unchanged_fraction"] == pytest.approx(1 - sum(int((forget[n] | retain[n]).sum()) for n in pre) / 9000)
    assert abs(r["F"]["raw"] - 0.5) < 0.05 and r["F"]["reversal"] > 0.75
    assert len(r["warnings"]) == 1 and "`reversal`" in r["warnings"][0]
    # reported, but left out of the max (and of the composite's features); signrev and dirreversal stay in
    assert r["omitted"] == ["reversal"] and r["F"]["max"] < 0.6
    assert r["F"]["best"] in ("raw", "qtile", "layernorm", "signrev", "dirreversal")


def test_on_a_sparse_injection_pure_noise_scores_chance_on_every_kept_family():
    # 450k weights, so one family's AUC on noise has a standard error of about 0.0013.
    pre, inj, unl, forget, retain, _ = _synthetic(shape=(300, 500), localized=False, seed=3)
    inj = {n: torch.where(forget[n] | retain[n], inj[n], pre[n]) for n in pre}
    unl = {n: inj[n] + torch.randn(inj[n].shape, generator=torch.Generator().manual_seed(i)) * 1e-3
           for i, n in enumerate(pre)}  # fmt: skip
    r = mask_auc(pre, inj, unl, forget, max_samples=450_000)  # the composite on every weight
    kept = [f for f in r["F"] if f not in ("max", "best", *r["omitted"])]
    assert set(kept) == {"raw", "qtile", "layernorm", "signrev", "dirreversal", "composite"}
    for family in kept:
        assert abs(r["F"][family] - 0.5) < 0.005, (family, r["F"][family])
    assert r["F"]["reversal"] > 0.85  # what the omission is for
    assert r["composite_features"] == ["raw", "qtile", "layernorm"]
    # A change that reverses the forget groups' injection is seen by the kept reversal families.
    reversed_unl = {n: unl[n] - 0.5 * (inj[n] - pre[n]) * forget[n] for n in pre}
    r = mask_auc(pre, inj, reversed_unl, forget, composite=False)
    assert r["F"]["signrev"] > 0.9 and r["F"]["dirreversal"] > 0.9 and r["F"]["best"] in ("signrev", "dirreversal")


def test_wide_masks_leave_few_weights_unchanged_and_reversal_is_still_left_out():
    """Two 40 % groups (the default testbed since Dec 7): Δ_inj is exactly 0 on only a fifth of the weights, and
    `reversal` still ranks every one of them below every masked weight, so pure noise reads AUC(F) 0.5 + 0.2 / (2 ·
    0.6) ≈ 0.67 and AUC(F|R) 1.0 on it. It is left out; every kept family reads chance."""
    pre, inj, unl, *_ = _synthetic(shape=(300, 500), localized=False, seed=4)
    g = torch.Generator().manual_seed(5)
    forget, retain = {}, {}
    for n in pre:
        u = torch.rand(pre[n].shape, generator=g)
        forget[n], retain[n] = u < 0.4, (u >= 0.4) & (u < 0.8)
    inj = {n: torch.where(forget[n] | retain[n], inj[n], pre[n]) for n in pre}
    unl = {n: inj[n] + torch.randn(inj[n].shape, generator=torch.Generator().manual_seed(i)) * 1e-3
           for i, n in enumerate(pre)}  # fmt: skip
    unified = {n: forget[n] | retain[n] for n in pre}
    r = mask_auc(pre, inj, unl, forget, unified_mask=unified, max_samples=450_000)
    assert r["inj_unchanged_fraction"] == pytest.approx(0.2, abs=0.005)
    assert r["F"]["reversal"] == pytest.approx(0.5 + 0.2 / (2 * 0.6), abs=0.01) and r["F|R"]["reversal"] > 0.99
    assert r["omitted"] == ["reversal"] and len(r["warnings"]) == 1
    for key in ("F", "F|R"):
        kept = [f for f in r[key] if f not in ("max", "best", *r["omitted"])]
        assert set(kept) == {"raw", "qtile", "layernorm", "signrev", "dirreversal", "composite"}
        for family in kept:
            assert abs(r[key][family] - 0.5) < 0.005, (key, family, r[key][family])
    # a dense injection (every weight moved, as with the paper's unmasked neutral text) keeps `reversal`
    dense = mask_auc(pre, {n: pre[n] + 1e-2 for n in pre}, unl, forget, composite=False)
    assert dense["inj_unchanged_fraction"] == 0 and dense["omitted"] == []


def test_mask_auc_rejects_mismatched_dicts():
    pre, inj, unl, forget, *_ = _synthetic(n_tensors=1)
    bad = {n: t[:5] for n, t in unl.items()}
    with pytest.raises(ValueError, match="shape"):
        mask_auc(pre, inj, bad, forget)
    with pytest.raises(ValueError, match="missing from theta_pre"):
        mask_auc({}, inj, unl, forget)


def test_mask_auc_layernorm_uses_component_std():
    pre, inj, unl, forget, *_ = _synthetic(n_tensors=2)
    r = mask_auc(pre, inj, unl, forget, composite=False)
    names = list(forget)
    y = np.concatenate([forget[n].reshape(-1).numpy() for n in names])
    ln = np.concatenate([((unl[n] - inj[n]).abs() / (unl[n] - inj[n]).std()).reshape(-1).numpy() for n in names])
    assert r["F"]["layernorm"] == pytest.approx(roc_auc_score(y, ln), abs=1e-5)


def _save_model(folder, tensors, shards=1):
    """``tensors`` as a save_pretrained-style directory: ``model.safetensors``, or shards plus their index."""
    folder.mkdir()
    if shards == 1:
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(folder / "model.safetensors"))
        return folder
    names, weight_map = list(tensors), {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n].contiguous() for n in part}, str(folder / file))
        weight_map |= dict.fromkeys(part, file)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _packed(forget, retain):
    # m^F as group 0, m^R as group 3 (bit 3).
    return {n: (forget[n].to(torch.int64) + 8 * retain[n].to(torch.int64)).to(torch.uint32) for n in forget}


def test_mask_auc_from_sharded_directories_equals_in_memory(tmp_path):
    pre, inj, unl, forget, retain, ctrl = _synthetic(n_tensors=5, shape=(40, 30))
    bias = "model.layers.0.mlp.down_proj.bias"  # shares its component's std with the weight, from another shard
    g = torch.Generator().manual_seed(5)
    pre[bias] = torch.randn(40, generator=g)
    inj[bias] = pre[bias] + torch.randn(40, generator=g) * 0.01
    unl[bias] = inj[bias] + torch.randn(40, generator=g) * 0.01
    forget[bias], retain[bias], ctrl[bias] = torch.arange(40) < 6, torch.arange(40) >= 34, torch.zeros(40)
    c_inj = {n: t + 0.5 for n, t in inj.items()}
    c_unl = {n: c_inj[n] + ctrl[n] for n in inj}
    save_masks(tmp_path / "masks.safetensors", _packed(forget, retain))
    dirs = {
        what: _save_model(tmp_path / what, tensors, shards)
        for what, tensors, shards in (("pre", pre, 3), ("inj", inj, 2), ("unl", unl, 1), ("c_inj", c_inj, 2),
                                      ("c_unl", c_unl, 1))
    }  # fmt: skip
    names = list(pre)  # the composite's subsample follows the names' order; the files list them sorted
    packed, _ = load_masks(tmp_path / "masks.safetensors", lazy=True)
    on_disk = mask_auc(
        dirs["pre"],
        str(dirs["inj"]),
        dirs["unl"],
        union_mask(packed, [0, 1, 2], lazy=True),
        control=(dirs["c_inj"], dirs["c_unl"]),
        unified_mask=union_mask(packed, [0, 1, 2, 3], lazy=True),
        names=names,
        max_samples=4_000,
    )
    unified = {n: forget[n] | retain[n] for n in names}
    delta = {n: c_unl[n] - c_inj[n] for n in names}  # the control's Δ as the callback passes it
    in_memory = mask_auc(pre, inj, unl, forget, control=delta, unified_mask=unified, names=names, max_samples=4_000)
    assert on_disk == in_memory
    spilled = mask_auc(
        pre, inj, unl, forget, control=delta, unified_mask=unified, names=names, max_samples=4_000,
        buffer_mib=0.01, spill_dir=tmp_path,
    )  # fmt: skip
    assert spilled == in_memory  # 6 040 scores, 2 621 a run: every AUC counted from the disk in runs
    with pytest.raises(ValueError, match="buffer_mib=0"):
        mask_auc(pre, inj, unl, forget, buffer_mib=0)
    assert on_disk["F"]["contrast"] > 0.9 and on_disk["F"]["signrev"] > 0.95 and on_disk["num_subsampled"] == 4_000
    assert on_disk["num_positive"]["F|R"] == sum(int(unified[n].sum()) for n in names)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        mask_auc(tmp_path / "nowhere", inj, unl, forget)
    small = _save_model(tmp_path / "small", {n: t[:, :3] if t.dim() == 2 else t for n, t in unl.items()})
    with pytest.raises(ValueError, match=r"theta_pre\[.*\] has shape \(40, 30\), expected \(40, 3\)"):
        mask_auc(pre, inj, small, forget)


def test_on_disk_mask_auc_agrees_with_in_memory_exact_auc_on_1e7_weights(tmp_path):
    g = torch.Generator().manual_seed(2)
    shape, n_tensors = (2_500, 1_000), 4  # 1e7 weights
    pre, inj, unl, forget, retain = {}, {}, {}, {}, {}
    for i in range(n_tensors):
        name = f"model.layers.{i}.self_attn.o_proj.weight"
        u = torch.rand(shape, generator=g)
        forget[name], retain[name] = u < 0.15, (u >= 0.15) & (u < 0.3)
        pre[name] = torch.randn(shape, generator=g)
        d_inj = torch.randn(shape, generator=g) * 0.01 * (1 + 2 * (u < 0.3))
        inj[name] = pre[name] + d_inj
        unl[name] = inj[name] + torch.randn(shape, generator=g) * 1e-3 - 0.5 * d_inj * forget[name]
        del u, d_inj
    save_masks(tmp_path / "masks.safetensors", _packed(forget, retain))
    dirs = [_save_model(tmp_path / what, t, 2) for what, t in (("pre", pre), ("inj", inj), ("unl", unl))]
    packed, _ = load_masks(tmp_path / "masks.safetensors", lazy=True)
    on_disk = mask_auc(*dirs, union_mask(packed, [0], lazy=True), names=list(pre), composite=False)
    assert on_disk["num_weights"] == 10_000_000
    names = list(pre)
    labels = torch.cat([forget[n].reshape(-1) for n in names])
    for family in ("raw", "signrev", "qtile"):
        scores = torch.cat([weight_features(family, pre[n], inj[n], unl[n]).reshape(-1) for n in names])
        assert on_disk["F"][family] == exact_auc([(scores, labels)])
    assert on_disk["F"]["signrev"] > 0.9 > 0.6 > abs(on_disk["F"]["raw"] - 0.5)
