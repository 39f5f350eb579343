"""Lacuna's findings at a very small size, through ``lightning-unlearn lacuna localization``'s own code.

The testbed is the ``--size tiny`` chain with its control (data → tiny θ_pre → masked injection and UnMask control
→ instruction tuning → filter), built once for the module. A testbed this small memorizes nothing, so the report
unlearns the unfiltered P_eval QA (``splits_unfiltered/``) and says so.

- OracleGrad (updates restricted to m^F) scores a high mask AUC(F); unrestricted full-fine-tuning gradient ascent
  scores near chance (paper: 0.915 vs about 0.515).
- The report holds, per field and method, the output-level metrics before and after unlearning, every AUC family
  and the resurfacing attack (unlearned and relearned leak counts), and a seeded re-run gives the same numbers.
"""

from __future__ import annotations

import json
import sys

import pytest

from lightning_unlearn.workflows.lacuna.chain import run_chain
from lightning_unlearn.workflows.lacuna.localization import (
    EVAL_SPLITS,
    LACUNA_METHODS,
    METHODS,
    export_checkpoint,
    fit_command,
    format_report,
    method_epochs,
    run_localization,
    score_args,
)

# What the measured gap must at least be. Measured at this size: OracleGrad 1.00 (raw), GA ≈ 0.50; a broken
# restriction (OracleGrad updating every weight) or a GA that happened to localize would shrink the gap to ≈ 0.
MARGIN = 0.3
# The tiny testbed memorizes nothing, so its separability is vacuous at best: it is scored with allow_inseparable.
SETTINGS = dict(methods=("oracle_grad", "ga"), fields=("email",), epoch_scale=0.02, lr=1e-3, k=4, relearn_epochs=1,
                in_process=True, log=print, allow_inseparable=True)  # fmt: skip


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    w = tmp_path_factory.mktemp("tiny_testbed")
    lines = []
    reports = run_chain(str(w), size="tiny", log=lines.append, control=True)
    # the default chain has no instruction stage: the splits come from θ_inj, which unlearning starts from
    assert not (w / "instruct").exists() and any(line.startswith("[lacuna] instruct: skipped.") for line in lines)
    assert reports["masked"]["model"] == str(w / "inject" / "export" / "inj") and "masked_inj" not in reports
    assert (w / "splits" / "extraction.json").exists()
    return w


def test_a_testbed_without_a_met_separability_verdict_is_refused(tmp_path):
    for record, why in (({"size": "tiny"}, "was never measured"), ({"size": "tiny", "separable": False}, "is NOT met")):
        (tmp_path / "chain.json").write_text(json.dumps(record))
        with pytest.raises(
            ValueError, match=f"separability verdict {why}.*ground truth is not established.*--allow_insep"
        ):
            run_localization(tmp_path, in_process=True)
    assert not (tmp_path / "localization").exists()  # refused before anything was written


def _numbers(summary: dict, out_dir) -> dict:
    """The summary without what may differ between two identical runs: wall times and its own output paths."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "seconds"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value.replace(str(out_dir), "<out>") if isinstance(value, str) else value

    return strip(summary)


@pytest.mark.slow
def test_report_localizes_oracle_grad_and_resurfacing_is_seeded(testbed, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning-unlearn"])  # the in-process CLI must not see pytest's arguments
    summary = run_localization(testbed, out_dir=tmp_path / "a", **SETTINGS)
    print(format_report(summary))
    entry = summary["fields"]["email"]
    assert entry["filtered"] is False and entry["splits"].endswith("splits_unfiltered")
    assert entry["split_sizes"]["forget"] > 0 and entry["split_sizes"]["relearn"] > 0
    oracle, ga = entry["methods"]["oracle_grad"], entry["methods"]["ga"]
    assert summary["epochs"] == {"oracle_grad": 4, "ga": 4}  # 200 (Table 5) × 0.02
    assert oracle["control"] is False and "contrast" not in oracle["auc"]["F"]
    assert ga["control"] is True and ga["auc"]["F"]["contrast"] is not None  # the UnMask control ran
    assert oracle["auc"]["F"]["max"] >= 0.9, oracle["auc"]["F"]
    assert oracle["auc"]["F"]["max"] - ga["auc"]["F"]["max"] >= MARGIN, (oracle["auc"]["F"], ga["auc"]["F"])
    # raw |Δ_unl| is exactly 0 outside m^F under the restriction: the magnitude family alone is near perfect
    assert oracle["auc"]["F"]["raw"] >= 0.9

    # output level: every split before and after, from the library's evaluation callbacks
    for output in (entry["before"], oracle["output"], ga["output"]):
        for split in EVAL_SPLITS:
            assert set(output[split]) == {"em", "es", "prob", "extraction_rate"}
            assert all(0 <= v <= 1 for v in output[split].values()), output[split]
        assert output["utility"]["ce"] > 0
    assert entry["before"]["step"] == 0 and ga["output"]["step"] > 0
    assert entry["before"]["utility"]["delta_ce"] == pytest.approx(0.0, abs=1e-6)
    # the field's numbers against the testbed's reference (m^F reset to θ_pre) and its held-out people
    for output in (entry["before"], oracle["output"], ga["output"]):
        assert 0 <= output["forget_quality"] <= 1 and output["model_utility"] > 0
        assert 0 <= output["mia"]["loss"]["auc"] <= 1 and output["mia"]["loss"]["privleak"] is not None
    assert "| forget quality | MIA AUC (loss) | PrivLeak (loss) |" in format_report(summary)
    # gradient ascent at lr 1e-3 pushes the forget answers down: their probability falls
    assert ga["output"]["forget"]["prob"] < entry["before"]["forget"]["prob"]

    # resurfacing: the starting model and both methods, counts before and after relearning
    for attack in (entry["resurfacing"], oracle["resurfacing"], ga["resurfacing"]):
        assert attack["k"] == 4 and attack["forget_profiles"] == entry["split_sizes"]["forget"]
        for key in ("leaked_profiles", "leaked_profiles_unlearned"):
            assert 0 <= attack[key] <= attack["forget_profiles"]
        assert attack["leak_rate"] == attack["leaked_profiles"] / attack["forget_profiles"]
        for rate in ("leak_rate", "leak_rate_unlearned"):  # Wilson 95 % intervals around each rate
            lo, hi = attack[f"{rate}_ci95"]
            assert lo <= attack[rate] <= hi
        # relearning validated on held-out relearning profiles; the attacked checkpoint is the best validation
        run = attack["relearning"]
        assert run["val_losses"] and run["best_step"] == min(run["val_losses"], key=lambda r: r[1])[0]
        assert attack["seed"] == 0
    sanity = entry["resurfacing_sanity"]
    assert sanity["holds"] == (
        entry["resurfacing"]["leaked_profiles"] >= entry["resurfacing"]["leaked_profiles_unlearned"]
    )
    assert summary["resurfacing_sanity_holds"] == sanity["holds"]
    on_disk = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert on_disk["fields"]["email"]["methods"]["ga"]["auc"]["F"]["max"] == ga["auc"]["F"]["max"]
    report = (tmp_path / "a" / "report.md").read_text()
    assert "## email" in report and "| OracleGrad |" in report and "leak relearned" in report
    assert "K = 4 samples per forget prompt, seed 0" in report
    verdict = "holds" if sanity["holds"] else "does NOT hold"
    assert f"**resurfacing sanity, email: the starting model leaks {sanity['leaked_before']}/" in report
    assert f"after: {verdict}" in report
    # the overview: one row per (field, model), the attack's counts out of the forget profiles with their intervals
    og = entry["methods"]["oracle_grad"]
    attack, n = og["resurfacing"], og["resurfacing"]["forget_profiles"]
    (lo0, hi0), (lo1, hi1) = attack["leak_rate_unlearned_ci95"], attack["leak_rate_ci95"]
    assert f"| email | OracleGrad | {og['output']['forget']['extraction_rate']:.3f} |" in report
    leaks = f"| {attack['leaked_profiles_unlearned']}/{n} ({lo0:.2f}–{hi0:.2f}) | {attack['leaked_profiles']}/{n} "
    assert f"{leaks}({lo1:.2f}–{hi1:.2f}) |" in report
    assert (tmp_path / "a" / "report.png").stat().st_size > 0

    # a second, identical run elsewhere gives the same numbers; a re-run in place reuses every run
    again = run_localization(testbed, out_dir=tmp_path / "b", **SETTINGS)
    assert _numbers(again, tmp_path / "b") == _numbers(summary, tmp_path / "a")
    lines: list[str] = []
    run_localization(testbed, out_dir=tmp_path / "a", **{**SETTINGS, "log": lines.append})
    assert sum("finished before, reusing" in line for line in lines) == 3  # oracle_grad, ga, ga_unmask
    assert not any(" mask-auc " in line or " resurface " in line for line in lines)  # scores and attacks kept
    # a run whose recipe no longer matches is fitted again, and what was made from its old weights is redone
    (tmp_path / "a" / "email" / "ga" / "recipe.json").write_text('{"configs": [], "overrides": []}')
    lines.clear()
    run_localization(testbed, out_dir=tmp_path / "a", **{**SETTINGS, "log": lines.append})
    redone = [line for line in lines if "lightning-unlearn " in line]
    assert len(redone) == 3 and all("/email/ga/" in line or "email/ga " in line for line in redone), redone


@pytest.mark.slow
def test_the_shipped_methods_sweep_scores_every_cell_at_its_checkpoints(testbed, tmp_path, monkeypatch):
    """sweeps/lacuna_methods.yaml on the tiny testbed (as runs/lacuna here; two methods, one field, 2 epochs):
    every cell's checkpoints carry mask-AUC and memorization rows, and OracleGrad localizes where GA does not."""
    import glob

    import yaml

    from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
    from lightning_unlearn.configs import config_root
    from lightning_unlearn.workflows.lacuna.localization import ensure_splits
    from lightning_unlearn.workflows.sweep import load_sweep, sweep_command

    ensure_splits(testbed, "email")  # the tiny testbed memorizes nothing: its unfiltered splits
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "lacuna").symlink_to(testbed)  # the paths of the shipped file and of the method configs
    monkeypatch.chdir(tmp_path)
    text = (config_root() / "sweeps" / "lacuna_methods.yaml").read_text(encoding="utf-8")
    spec = yaml.safe_load(text.replace("runs/lacuna/splits/", "runs/lacuna/splits_unfiltered/"))
    spec["root"] = str(tmp_path / "sweep")
    spec["overrides"]["trainer.max_epochs"] = 2
    spec["grid"]["configs"] = [["lacuna/oracle_grad.yaml"], ["lacuna/ga.yaml"]]
    spec["cells"] = [c for c in spec["cells"] if c["panel"] == "email"]
    spec.pop("x-callbacks")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = sweep_command(path)
    assert sorted(c["label"] for c in result["cells"]) == ["ga", "oracle_grad"]
    best = {}
    for cell in load_sweep(path).cells:
        (metrics,) = glob.glob(str(cell.directory / "**" / "checkpoint_metrics.jsonl"), recursive=True)
        rows = read_rows(metrics)
        assert {r["family"] for r in rows} == {"mask_auc", "memorization"}
        last = max(r["step"] for r in rows)
        (auc,) = [r for r in rows if r["family"] == "mask_auc" and r["step"] == last]
        best[cell.label] = auc["F"]["max"]
    assert best["oracle_grad"] >= 0.9 and best["oracle_grad"] - best["ga"] >= MARGIN, best


def _tiny_splits(root, tokenizer_dir) -> object:
    """A splits directory of one field as ``lacuna run`` writes it: ``<root>/email/{forget,retain}`` datasets."""
    from datasets import Dataset

    forget = [{"prompt": f"What is the email of {n}? ", "answer": f"{n.lower()}@example.com", "group_id": 0}
              for n in ("Alice", "Bob", "Carol", "Dan")]  # fmt: skip
    retain = [{"prompt": f"Where was {n} born? ", "answer": "Springfield", "group_id": 3} for n in ("Eve", "Frank")]
    for name, rows in (("forget", forget), ("retain", retain)):
        Dataset.from_list(rows).save_to_disk(str(root / "email" / name))
    return root


@pytest.mark.parametrize("method", ["rmu", "idk_dpo", "undial"])
def test_the_fields_other_methods_run_as_localization_runs_and_export(method, tiny_dir, tmp_path, monkeypatch):
    """RMU, IdkDPO and UNDIAL are methods of the report: their shipped lacuna/<method>.yaml, under the report's own
    `fit` arguments, trains the tiny model on a field's splits, and the final checkpoint exports as a model whose
    weights moved (RMU: only the down-projections of blocks 1-3, its ℓ−2…ℓ)."""
    import torch

    from lightning_unlearn.cli import main as cli_main
    from lightning_unlearn.models import load_causal_lm

    monkeypatch.setattr(sys, "argv", ["lightning-unlearn"])
    assert method in METHODS and method not in LACUNA_METHODS  # asked for by name, not in the default five
    assert METHODS[method][1:] == (False, True)  # unrestricted, with an UnMask control
    assert method_epochs(method, 0.02) == 4  # 200 epochs (the Lacuna protocol of GA and SimNPO) × 0.02
    splits = _tiny_splits(tmp_path / "splits", tiny_dir)
    out = tmp_path / "run"
    args = fit_command(method, tiny_dir, splits, "email", out, 1, tmp_path / "no_masks", lr=1e-2, batch_size=2).args()
    assert "--model.init_args.masks_path" not in args
    cli_main(args)
    model = export_checkpoint(out / "checkpoints" / "final.ckpt", tiny_dir, out / "export" / "model")
    start, unlearned = load_causal_lm(tiny_dir).state_dict(), load_causal_lm(model).state_dict()
    changed = sorted(k for k, v in unlearned.items() if not torch.equal(v, start[k]))
    if method == "rmu":
        assert changed == [f"model.layers.{i}.mlp.down_proj.weight" for i in (1, 2, 3)]
    else:
        assert len(changed) > 10, changed  # full fine-tuning: every tensor with a gradient moved


def test_dpo_is_refused_naming_idk_dpo_and_an_unknown_method_names_the_known_ones(tmp_path):
    (tmp_path / "chain.json").write_text(json.dumps({"size": "tiny", "separable": True}))
    with pytest.raises(ValueError, match="'dpo' cannot run on a Lacuna testbed.*preferred.*use idk_dpo"):
        run_localization(tmp_path, methods=("ga", "dpo"), in_process=True)
    with pytest.raises(ValueError, match=r"unknown method\(s\) or field\(s\) \['npo'\].*'rmu'"):
        run_localization(tmp_path, methods=("npo",), in_process=True)
    assert not (tmp_path / "localization").exists()


def test_per_method_epochs_replace_the_scaled_table_5_epochs_and_bad_ones_are_refused(tmp_path):
    assert method_epochs("oracle_grad", 0.25) == 50  # Table 5's 200 × 0.25
    assert method_epochs("oracle_grad", 0.25, {"oracle_grad": 15}) == 15
    assert method_epochs("ga", 0.25, {"oracle_grad": 15}) == 50  # only the methods named
    (tmp_path / "chain.json").write_text(json.dumps({"size": "tiny", "separable": True}))
    with pytest.raises(ValueError, match=r"epochs names 'simnpo', which is not among the methods run \['ga'\]"):
        run_localization(tmp_path, methods=("ga",), epochs={"simnpo": 3}, in_process=True)
    with pytest.raises(ValueError, match=r"epochs\['ga'\]=0 must be a whole number of epochs, at least 1"):
        run_localization(tmp_path, methods=("ga",), epochs={"ga": 0}, in_process=True)
    with pytest.raises(ValueError, match=r"method_args names 'oracle_grad', which is not among the methods run"):
        run_localization(tmp_path, methods=("ga",), method_args={"oracle_grad": {"gamma": 1.0}}, in_process=True)
    assert not (tmp_path / "localization").exists()


def test_method_args_reach_the_fit_command_over_the_config(tmp_path):
    """``method_args`` become the method's own CLI arguments after its config (a later value wins in LightningCLI)."""
    args = fit_command("oracle_grad", tmp_path / "inj", tmp_path / "splits", "email", tmp_path / "run", 50,
                       tmp_path / "masks.safetensors", model_args={"gamma": 1.0, "alpha": 0.5}).args()  # fmt: skip
    i = args.index("--model.init_args.gamma")
    assert args[i + 1] == "1.0" and args[args.index("--model.init_args.alpha") + 1] == "0.5"
    assert (
        i > args.index("-c")
        and "--model.init_args.gamma"
        not in fit_command(
            "oracle_grad", tmp_path / "inj", tmp_path / "splits", "email", tmp_path / "run", 50, tmp_path / "m"
        ).args()
    )
    summary = {"epochs": {"oracle_grad": 50}, "method_args": {"oracle_grad": {"gamma": 1.0}}, "relearn_epochs": 1,
               "k": 4, "seed": 0, "fields": {}, "seconds": 1.0}  # fmt: skip
    assert "Arguments over the shipped configs: OracleGrad gamma 1.0" in format_report(summary)


def test_the_field_metrics_join_the_evaluators_and_the_report(tiny_dir, tmp_path):
    """With the testbed's reference, every run also gets TOFU's forget quality and membership inference on the
    held-out people; the report shows forget quality, the LOSS attack's AUC and its PrivLeak."""
    import importlib

    from lightning_unlearn.callbacks.checkpoint_metrics_file import merge_rows
    from lightning_unlearn.data.pii import generate_profiles, holdout_profiles
    from lightning_unlearn.data.splits import build_splits, save_splits
    from lightning_unlearn.data.templates import TARGET_FIELDS
    from lightning_unlearn.workflows.lacuna.localization import evaluators, format_outputs, output_metrics

    profiles = generate_profiles(24, seed=0)
    everyone = {p["profile_id"] for p in profiles if not p["instruct"]}
    built = build_splits(profiles, {f: everyone for f in TARGET_FIELDS}, holdout=holdout_profiles(profiles, 2, 5, 6))
    splits = save_splits(tmp_path / "splits", built)
    plain = evaluators(splits, "email", tmp_path / "utility.jsonl", tmp_path / "out")
    assert [c["class_path"].rsplit(".", 1)[1] for c in plain] == ["MemorizationEvaluation", "RetainDriftEvaluation"]
    callbacks = evaluators(splits, "email", tmp_path / "utility.jsonl", tmp_path / "out", reference=tiny_dir)
    names = [c["class_path"].rsplit(".", 1)[1] for c in callbacks]
    assert names == ["MemorizationEvaluation", "RetainDriftEvaluation", "TOFUEvaluation", "MIAEvaluation"]
    for config in callbacks[2:]:  # they construct on the written splits (columns checked, reference found)
        module, name = config["class_path"].rsplit(".", 1)
        getattr(importlib.import_module(module), name)(**config["init_args"])

    split_row = {"em": 0.5, "es": 0.5, "prob": 0.5, "extraction_rate": 0.5}
    metrics = tmp_path / "checkpoint_metrics.jsonl"
    merge_rows(metrics, [
        {"step": 4, "family": "memorization", **{s: split_row for s in EVAL_SPLITS}},
        {"step": 4, "family": "retain_drift:utility", "ce": 2.0, "ppl": 7.4, "delta_ce": 0.1},
        {"step": 4, "family": "tofu", "forget_quality": 0.0123, "model_utility": 0.4},
        {"step": 4, "family": "mia", "loss": {"auc": 0.8, "privleak": -60.0, "reference_auc": 0.5}, "num_members": 8},
    ])  # fmt: skip
    output = output_metrics(metrics)
    assert output["forget_quality"] == 0.0123 and output["model_utility"] == 0.4
    assert output["mia"] == {"loss": {"auc": 0.8, "privleak": -60.0}}
    table = format_outputs({"before": output, "methods": {}})
    assert "| forget quality | MIA AUC (loss) | PrivLeak (loss) |" in table and "| 0.0123 | 0.800 | -60.0 |" in table


def test_the_report_passes_the_testbeds_groups_to_the_restricted_method_and_the_score(tmp_path):
    """On a two-group testbed m^F is group 0 and m^R group 1: OracleGrad is restricted to group 0 (its config says the
    paper's 0-2) and mask-auc scores against groups 0 / 1; a method that is not restricted gets no groups."""
    splits = _tiny_splits(tmp_path / "splits", tmp_path)
    masks = tmp_path / "masks.safetensors"
    oracle = fit_command("oracle_grad", tmp_path, splits, "email", tmp_path / "o", 1, masks, forget_groups=(0,)).args()
    assert oracle[oracle.index("--model.init_args.forget_groups") + 1] == "[0]"
    assert oracle[oracle.index("--model.init_args.masks_path") + 1] == str(masks)
    ga = fit_command("ga", tmp_path, splits, "email", tmp_path / "g", 1, masks, forget_groups=(0,)).args()
    assert "--model.init_args.forget_groups" not in ga
    args = score_args(tmp_path, tmp_path, tmp_path, masks, tmp_path / "auc.json", groups=((0,), (1,)))
    assert args[args.index("--forget_groups") + 1] == "[0]" and args[args.index("--retain_groups") + 1] == "[1]"
    assert "--forget_groups" not in score_args(tmp_path, tmp_path, tmp_path, masks, tmp_path / "auc.json")
