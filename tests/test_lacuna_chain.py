"""The whole Lacuna chain (`lightning-unlearn lacuna run`) at a very small size: every stage's export, the
splits, the extraction table, reuse on a second run, and the resurfacing attack on the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from datasets import load_from_disk

from lightning_unlearn.console import UNWANTED_OUTPUT
from lightning_unlearn.data.records import TRUTH_RATIO_COLUMNS
from lightning_unlearn.data.splits import FIELD_SPLITS, SPLIT_COLUMNS
from lightning_unlearn.data.templates import TARGET_FIELDS
from lightning_unlearn.workflows.lacuna.chain import RESULT_FILE, chain_result, chain_verdicts, run_chain
from lightning_unlearn.workflows.lacuna.resurface import resurface


@pytest.mark.slow
def test_chain_tiny(tmp_path):
    # As a user runs it, in a fresh process: the output carries no warning or traceback, and ends with the verdicts.
    cmd = [sys.executable, "-m", "lightning_unlearn.cli", "lacuna", "run", "--workdir", str(tmp_path), "--size", "tiny",
           "--instruct", "true"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "HF_HUB_DISABLE_PROGRESS_BARS")}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-4000:]
    assert not UNWANTED_OUTPUT.search(output), "\n".join(li for li in output.splitlines() if UNWANTED_OUTPUT.search(li))
    # the closing block ends the output: each verdict once, then where the full result is
    _, closing = out.stdout.rsplit(f"Lacuna testbed in {tmp_path}:\n", 1)
    *verdict_lines, last = closing.splitlines()
    assert last.endswith(str(tmp_path / RESULT_FILE)) and all(line.startswith("  ") for line in verdict_lines)
    assert all(sum(line.strip() in li for li in output.splitlines()) == 1 for line in verdict_lines)
    lines = output.splitlines()
    # Its output is a pipe, as under nohup or SLURM: every training stage's progress lines come through, and each
    # stage line names the file with the stage's whole output.
    for stage in ("pretrain", "inject", "instruct"):
        assert any(line.startswith(f"[lacuna] {stage}: fit: step ") for line in lines), stage
        assert f"full log: {tmp_path / stage / 'stage.log'}" in output
        assert "fit: step" in (tmp_path / stage / "stage.log").read_text(encoding="utf-8")
    reports = run_chain(str(tmp_path), size="tiny", instruct=True, log=[].append)  # every stage reused
    assert json.loads((tmp_path / RESULT_FILE).read_text()) == chain_result(reports)
    # the default builds the masked testbed only
    assert set(reports) == {"masked", "masked_inj", "separability"} and not (tmp_path / "inject_unmasked").exists()
    sizes = reports["masked"]["split_sizes"]
    assert any(line.startswith("Memorization-filtered splits") for line in lines)
    verdicts = json.loads((tmp_path / "chain.json").read_text())["verdicts"]
    assert verdicts == chain_verdicts(reports)
    assert verdicts["splits"].startswith("[lacuna] splits (≥ 8 forget and ≥ 8 retain pairs for every field): ")
    assert sizes["relearn"] == sum(1 for _ in load_from_disk(str(tmp_path / "splits" / "relearn")))
    # the UnMask control joins the same work directory later; the masked stages are reused
    lines.clear()
    reports = run_chain(str(tmp_path), size="tiny", instruct=True, log=lines.append, control=True)
    # pretrain, inject, instruct, 2 filters, separability
    assert sum("finished before, reusing" in line for line in lines) == 6
    for stage in ("inject", "inject_unmasked"):
        export = tmp_path / stage / "export"
        assert (export / "pre" / "config.json").exists() and (export / "inj" / "model.safetensors").exists()
        assert (export / "masks.safetensors").exists()
    assert json.loads((tmp_path / "inject_unmasked" / "export" / "run.json").read_text())["masked"] is False
    for name in ("masked", "unmasked"):
        assert set(reports[name]["extraction"]) == set(TARGET_FIELDS)
        assert all(0 <= r <= 1 for r in reports[name]["extraction"].values())
    for field in TARGET_FIELDS:
        for split in FIELD_SPLITS:
            ds = load_from_disk(str(tmp_path / "splits" / field / split))
            assert tuple(ds.column_names) == SPLIT_COLUMNS + TRUTH_RATIO_COLUMNS
    assert any(line.startswith("Extraction rate per field") for line in lines)
    # θ_inj is measured too, before instruction tuning, without splits
    for name, stage in (("masked_inj", "inject"), ("unmasked_inj", "inject_unmasked")):
        assert reports[name]["model"] == str(tmp_path / stage / "export" / "inj")
        assert "split_sizes" not in reports[name]
    assert any("θ_inj, before it" in line for line in lines)
    assert chain_verdicts(reports)["memorization"].startswith("[lacuna] target (masked, ≥ 50% on ≥ 2 fields): ")
    assert not any(line.startswith("[lacuna] target (") for line in lines)  # a verdict is the result, not progress
    _exports_generate_the_same_text_through_plain_transformers(tmp_path)
    _separability_is_measured_and_its_arithmetic_holds(tmp_path, reports, lines)

    lines.clear()
    run_chain(str(tmp_path), size="tiny", instruct=True, log=lines.append, control=True)
    assert sum("finished before, reusing" in line for line in lines) == 10

    # a stage built from other overrides (e.g. a changed preset) is refused by name, not silently reused
    recipe_path = tmp_path / "instruct" / "recipe.json"
    recipe = json.loads(recipe_path.read_text())
    assert recipe["overrides"][:2] == ["--data.data_dir", "<workdir>/data"] and len(recipe["configs"]) == 1
    recipe_path.write_text(json.dumps({**recipe, "overrides": [*recipe["overrides"], "--model.optim.lr", "9"]}))
    refused = r"stage instruct in .* other overrides than this run's \(--model.optim.lr, 9\)"
    with pytest.raises(ValueError, match=refused):
        run_chain(str(tmp_path), size="tiny", instruct=True, log=lines.append, control=True)
    # one built by other code (code defaults are in no config) is reused, with a warning that names it
    recipe_path.write_text(json.dumps({**recipe, "code": "0123456789abcdef"}))
    lines.clear()
    run_chain(str(tmp_path), size="tiny", instruct=True, log=lines.append, control=True)
    warned = [line for line in lines if "other lightning_unlearn code" in line]
    assert len(warned) == 1 and warned[0].startswith("[lacuna] instruct: ") and "0123456789abcdef" in warned[0]
    assert sum("finished before, reusing" in line for line in lines) == 10
    recipe_path.write_text(json.dumps(recipe))
    # an injection rebuilt after the instruction tuning made from it leaves that tuning stale
    inj = tmp_path / "inject_unmasked" / "export" / "inj"
    built = inj.stat()
    later = (tmp_path / "instruct_unmasked" / "export" / "model").stat().st_mtime + 60
    os.utime(inj, (later, later))
    with pytest.raises(ValueError, match=r"stage instruct_unmasked: .* is older than its input"):
        run_chain(str(tmp_path), size="tiny", instruct=True, log=lines.append, control=True)
    # a filter older than the model it measured (e.g. after a plain `cp -r` of the work directory) is measured again
    os.utime(inj, ns=(built.st_atime_ns, built.st_mtime_ns))
    model = tmp_path / "instruct" / "export" / "model"
    os.utime(model, (later, later))
    lines.clear()
    # without the control: the masked stages only
    run_chain(str(tmp_path), size="tiny", instruct=True, log=lines.append)
    assert any(line.startswith("[lacuna] filter (masked): ") and "measuring again" in line for line in lines)
    # pretrain, inject, instruct, θ_inj filter, separability
    assert sum("finished before, reusing" in line for line in lines) == 5

    # the resurfacing attack on a hand-made split: one forget profile whose answer the model cannot know
    rows = {"prompt": ["Question: A B. What is her email address?\nAnswer:"], "answer": [" zq@x.org"],
            "field": ["email"], "profile_id": [0], "group_id": [0]}  # fmt: skip
    from datasets import Dataset

    splits = tmp_path / "attack_splits"
    Dataset.from_dict(rows).save_to_disk(str(splits / "email" / "forget"))
    # four other people: the attack validates on a held-out share of them
    Dataset.from_dict({**rows, "prompt": rows["prompt"] * 4, "answer": rows["answer"] * 4,
                       "field": ["email"] * 4, "profile_id": [1, 2, 3, 4], "group_id": [3] * 4}).save_to_disk(
        str(splits / "relearn"))  # fmt: skip
    report = resurface(
        str(tmp_path / "instruct" / "export" / "model"),
        str(splits),
        "email",
        str(tmp_path / "attack"),
        k=3,
        max_epochs=1,
    )
    assert report["forget_profiles"] == 1 and report["k"] == 3
    assert report["leaked_profiles"] in (0, 1) and report["leaked_profiles_unlearned"] in (0, 1)
    assert json.loads((tmp_path / "attack" / "resurfacing.json").read_text())["leak_rate"] == report["leak_rate"]


def _exports_generate_the_same_text_through_plain_transformers(workdir):
    """A user's own script (AutoTokenizer + AutoModelForCausalLM + generate, no BOS handling) gets the project's
    greedy answers from every exported model: the saved tokenizer adds the BOS the stages trained with."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_unlearn.data.pii import probe_qa
    from lightning_unlearn.data.testbed_data import load_table
    from lightning_unlearn.generation import generate
    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    profiles = list(load_table(workdir / "data", "profiles"))[:3]
    prompts = [probe_qa(p, "email")["prompt"] for p in profiles]
    for export in (workdir / "inject" / "export" / "inj", workdir / "instruct" / "export" / "model"):
        ours = [a[0] for a in generate(load_causal_lm(export), load_tokenizer(export), prompts, max_new_tokens=12)]
        tokenizer, model = AutoTokenizer.from_pretrained(export), AutoModelForCausalLM.from_pretrained(export)
        plain = []
        for prompt in prompts:
            enc = tokenizer(prompt, return_tensors="pt")
            assert enc["input_ids"][0, 0].item() == tokenizer.bos_token_id
            ids = model.generate(**enc, max_new_tokens=12, do_sample=False)
            plain.append(tokenizer.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))
        assert plain == ours, export


def _separability_is_measured_and_its_arithmetic_holds(workdir, reports, lines):
    """The chain measures separability (table, verdict, chain.json); a reset touches exactly its groups' mask
    elements; and the verdict's arithmetic on the tiny testbed's real export, with an extraction that reads the
    weights (a group "extracts" while its mask elements differ from θ_pre), passes a separable testbed and names the
    group that leans on another."""
    import torch

    from lightning_unlearn.masks import canonical_name, group_mask, load_masks
    from lightning_unlearn.models import load_causal_lm, load_weights
    from lightning_unlearn.workflows.lacuna import separability

    sep = reports["separability"]
    assert set(sep["resets"]) == {*(f"group {g}" for g in range(6)), "m^F", "m^R"}
    assert sep["resets"]["m^F"]["groups"] == [0, 1, 2] and sep["utility"]["pre"] > 0
    verdict = chain_verdicts(reports)["separability"]
    assert verdict.startswith("[lacuna] separability (") and verdict.endswith(": met") == sep["met"]
    assert not any(line.startswith("[lacuna] separability (") for line in lines)  # once, in the command's result
    chain = json.loads((workdir / "chain.json").read_text())
    assert chain["separable"] == sep["met"] and chain["verdicts"]["separability"] == verdict

    export = workdir / "inject" / "export"
    model, pre = load_causal_lm(export / "inj"), load_weights(export / "pre")
    inj = {canonical_name(n): p.detach().clone() for n, p in model.named_parameters()}
    packed = dict(load_masks(export / "masks.safetensors")[0])
    with separability._Reset(model, pre, packed, [2, 4]):
        now = {canonical_name(n): p.detach() for n, p in model.named_parameters()}
        for name, bits in packed.items():
            reset = group_mask(bits, [2, 4])
            assert torch.equal(now[name][reset], pre[name][reset]) and torch.equal(now[name][~reset], inj[name][~reset])
    assert all(torch.equal(p, inj[canonical_name(n)]) for n, p in model.named_parameters())

    def present(model, g):  # group g's injected change is in the model
        params = {canonical_name(n): p for n, p in model.named_parameters()}
        return any(not torch.equal(params[n][group_mask(b, g)], pre[n][group_mask(b, g)]) for n, b in packed.items())

    def fake_extraction(leans_on):
        def measure(model, tokenizer, profiles, fields=()):
            rates = {g: float(present(model, g) and all(present(model, h) for h in leans_on.get(g, ()))) for g in
                     range(6)}  # fmt: skip
            return {str(g): {"hits": int(4 * r), "trials": 4, "rate": r} for g, r in rates.items()}

        return measure

    original = separability.group_extraction
    try:
        separability.group_extraction = fake_extraction({})
        report = separability.separability_report(export, workdir / "data")
        assert all(r["met"] for r in report["resets"].values()), report["resets"]
        assert report["resets"]["group 3"]["extraction"]["3"]["rate"] == 0.0
        assert report["resets"]["group 3"]["extraction"]["4"]["rate"] == 1.0
        # group 1's people need group 0's weights too: resetting group 0 takes them along, and the verdict says so
        separability.group_extraction = fake_extraction({1: (0,)})
        report = separability.separability_report(export, workdir / "data")
        assert not report["met"] and not report["resets"]["group 0"]["met"]
        assert report["resets"]["group 0"]["failures"] == ["group 1 falls to 0.00 < 0.9×1.00"]
        assert [n for n, r in report["resets"].items() if not r["met"]] == ["group 0"]  # m^F resets both: still met
        assert "NOT met (group 0" in separability.separability_verdict(report)
        table = separability.format_separability(report)
        assert "FAILS: group 1 falls to 0.00" in table and "1.00*" not in table.splitlines()[4]

        # a group θ_inj does not memorize passes every reset vacuously: the verdict fails it instead
        def without_group_5(model, tokenizer, profiles, fields=()):  # group 5 extracts 1 in 4 while present
            rates = fake_extraction({})(model, tokenizer, profiles)
            hits = int(rates["5"]["rate"])
            return {**rates, "5": {"hits": hits, "trials": 4, "rate": hits / 4}}

        separability.group_extraction = without_group_5
        report = separability.separability_report(export, workdir / "data")
        assert all(r["met"] for r in report["resets"].values()) and report["unmemorized"] == [5]
        assert not report["met"] and "groups [5] below 0.5" in separability.separability_verdict(report)
    finally:
        separability.group_extraction = original


@pytest.mark.slow
def test_chain_from_a_model_path_skips_pretraining(tiny_dir, tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  init_args:\n    optim: {lr: 0.0123}\n")
    work = tmp_path / "w"
    lines: list[str] = []
    instruct_overlay = tmp_path / "instruct_overlay.yaml"
    instruct_overlay.write_text("model:\n  init_args:\n    optim: {lr: 0.000321}\n")
    kwargs = dict(model_path=str(tiny_dir), inject_configs=[overlay], instruct_configs=[instruct_overlay], control=True,
                  instruct=True)  # fmt: skip
    reports = run_chain(str(work), size="tiny", log=lines.append, **kwargs)
    assert not (work / "pretrain").exists() and not (work / "tokenizer").exists()
    for stage in ("inject", "inject_unmasked"):
        assert json.loads((work / stage / "export" / "run.json").read_text())["model_path"] == str(tiny_dir)
        config = yaml.safe_load((work / stage / "lightning_logs" / "version_0" / "config.yaml").read_text())
        assert config["model"]["init_args"]["optim"]["lr"] == 0.0123  # the overlay reached both injections
    for stage in ("instruct", "instruct_unmasked"):
        config = yaml.safe_load((work / stage / "lightning_logs" / "version_0" / "config.yaml").read_text())
        assert config["model"]["init_args"]["optim"]["lr"] == 0.000321  # and the other one both instruction tunings
    assert set(reports["masked"]["extraction"]) == set(TARGET_FIELDS)

    lines.clear()
    run_chain(str(work), size="tiny", log=lines.append, **kwargs)
    assert sum("finished before, reusing" in line for line in lines) == 9  # 8 stages and filters, separability
    with pytest.raises(ValueError, match="Choose another --workdir"):  # same model, no instruction overlay
        run_chain(str(work), size="tiny", model_path=str(tiny_dir), inject_configs=[overlay], instruct=True)


def test_chain_refuses_a_workdir_built_from_another_model(tiny_dir, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "chain.json").write_text(json.dumps({"size": "tiny", "model": "built-in tiny", "inject_configs": []}))
    with pytest.raises(ValueError, match="Choose another --workdir"):
        run_chain(str(work), size="tiny", model_path=str(tiny_dir))
    assert sorted(p.name for p in work.iterdir()) == ["chain.json"]


def test_chain_rejects_a_model_path_without_a_model(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        run_chain(str(tmp_path / "w"), size="tiny", model_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--inject_config"):
        run_chain(str(tmp_path / "w"), size="tiny", inject_configs=[str(tmp_path / "missing.yaml")])
    with pytest.raises(FileNotFoundError, match="--instruct_config"):
        run_chain(str(tmp_path / "w"), size="tiny", instruct_configs=[str(tmp_path / "missing.yaml")])
    assert not (tmp_path / "w").exists()


def test_a_pretrain_overlay_follows_the_pretraining_config_and_is_recorded(tmp_path, monkeypatch):
    from lightning_unlearn.workflows.lacuna import chain

    overlay = tmp_path / "heal.yaml"
    overlay.write_text("trainer:\n  max_steps: 7\n")
    commands = []

    class Stop(Exception):
        pass

    def run(self, todo):
        commands.extend(todo)
        raise Stop  # the command is what is checked; nothing trains

    monkeypatch.setattr(chain._Stages, "run", run)
    with pytest.raises(Stop):
        run_chain(str(tmp_path / "w"), size="tiny", pretrain_configs=[str(overlay)], log=[].append)
    ((name, fit, _),) = commands
    cmd = fit.args()
    configs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-c"]
    assert name == "pretrain" and configs[0].endswith("pretrain_tiny.yaml") and configs[1:] == [str(overlay)]
    assert json.loads((tmp_path / "w" / "chain.json").read_text())["pretrain_configs"] == [str(overlay)]
    with pytest.raises(ValueError, match="Choose another --workdir"):  # the same work directory without the overlay
        run_chain(str(tmp_path / "w"), size="tiny", log=[].append)
    with pytest.raises(ValueError, match="--pretrain_config overlays the pretraining stage, which --model_path skips"):
        run_chain(str(tmp_path / "x"), size="tiny", pretrain_configs=[str(overlay)], model_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--pretrain_config"):
        run_chain(str(tmp_path / "x"), size="tiny", pretrain_configs=[str(tmp_path / "missing.yaml")])


def test_the_stages_share_every_core_or_the_callers_omp_num_threads(tmp_path, monkeypatch):
    """A caller's OMP_NUM_THREADS (a shared machine; this suite's one thread per process) caps the threads the stages
    share; unset, or not a whole number, they share every core. Side by side on two cores or more either way."""
    from lightning_unlearn.workflows.lacuna import chain

    seen = []

    class Stop(Exception):
        pass

    def run(self, todo):
        seen.append((self.parallel, self.threads))
        raise Stop  # the first stage's budget is what is checked; nothing trains

    monkeypatch.setattr(chain._Stages, "run", run)
    monkeypatch.setattr(chain.os, "cpu_count", lambda: 8)
    for i, limit in enumerate(["1", "3", "16", "", "4,2", None]):
        if limit is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", limit)
        with pytest.raises(Stop):
            run_chain(str(tmp_path / f"w{i}"), size="tiny", log=[].append)
    assert seen == [(True, 1), (True, 3), (True, 8), (True, 8), (True, 8), (True, 8)]


def test_a_workdir_from_before_instruct_overlays_is_still_reused(tmp_path):
    from lightning_unlearn.workflows.lacuna.chain import _check_provenance

    (tmp_path / "chain.json").write_text(json.dumps({"size": "tiny", "model": "built-in tiny", "inject_configs": []}))
    record = {"size": "tiny", "model": "built-in tiny", "inject_configs": [], "instruct_configs": []}
    _check_provenance(tmp_path, record)  # no instruction overlay then, none now: the same chain
    with pytest.raises(ValueError, match="Choose another --workdir"):
        _check_provenance(tmp_path, {**record, "instruct_configs": ["/x/lr.yaml"]})


def test_target_verdict_counts_fields_at_or_above_half():
    from lightning_unlearn.workflows.lacuna.chain import target_verdict

    def report(*rates):
        return {"extraction": dict(zip(TARGET_FIELDS, rates, strict=True))}

    assert ": met; fields at or above: email, phone" in target_verdict(report(1.0, 0.49, 0.5, 0.0))
    missed = target_verdict(report(0.5, 0.4999, 0.0, 0.0))
    assert ": NOT met; fields at or above: email (docs/" in missed
    assert ": NOT met; fields at or above: none" in target_verdict(report(0, 0, 0, 0))


def test_format_table_with_and_without_the_inj_columns():
    from lightning_unlearn.workflows.lacuna.chain import format_table

    def report(*rates):
        return {"profiles": 18, "extraction": dict(zip(TARGET_FIELDS, rates, strict=True))}

    one = format_table(report(0.5, 0, 0, 0)).splitlines()  # no UnMask control built
    assert one[1].split() == ["field", "masked"] and one[2].split() == [TARGET_FIELDS[0], "50.00%"]
    one_inj = format_table(report(0.5, 0, 0, 0), None, report(0.75, 0, 0, 0)).splitlines()
    assert one_inj[2].split() == ["field", "masked", "masked"]
    assert one_inj[3].split() == [TARGET_FIELDS[0], "50.00%", "75.00%"]
    two = format_table(report(0.5, 0, 0, 0), report(1, 1, 1, 1)).splitlines()
    assert two[1].split() == ["field", "masked", "unmasked"]
    assert two[2].split() == [TARGET_FIELDS[0], "50.00%", "100.00%"]
    four = format_table(report(0.5, 0, 0, 0), report(1, 1, 1, 1), report(0.75, 0, 0, 0), report(0.25, 0, 0, 0))
    lines = four.splitlines()
    assert lines[2].split() == ["field", "masked", "unmasked", "masked", "unmasked"]
    assert lines[3].split() == [TARGET_FIELDS[0], "50.00%", "100.00%", "75.00%", "25.00%"]


def test_split_sizes_table_and_verdict():
    from lightning_unlearn.workflows.lacuna.chain import format_split_sizes, split_verdict

    sizes = {f"{f}/{s}": 9 for f in TARGET_FIELDS for s in FIELD_SPLITS} | {"relearn": 40}
    table = format_split_sizes(sizes).splitlines()
    assert table[1].split() == ["field", *FIELD_SPLITS] and table[2].split() == [TARGET_FIELDS[0], *["9"] * 6]
    assert table[-1].startswith("relearn: 40 rows")
    assert split_verdict(sizes).endswith(": met")
    short = split_verdict({**sizes, "phone/retain": 7, "email/forget": 8})
    assert short.endswith(": NOT met (phone retain 7)")


def test_an_interrupted_stage_resumes_from_its_newest_readable_last_checkpoint(tmp_path):
    import time

    import torch

    from lightning_unlearn.checkpoints import latest_checkpoint
    from lightning_unlearn.workflows.lacuna.chain import _fit_cmd

    root = tmp_path / "inject"
    assert "--ckpt_path" not in _fit_cmd("inject.yaml", root, []).args()
    for version in (0, 1, 2):  # a stage interrupted three times: each launch gets a new logger version directory
        ckpt = root / "lightning_logs" / f"version_{version}" / "checkpoints" / "last.ckpt"
        ckpt.parent.mkdir(parents=True)
        torch.save({"global_step": version}, ckpt)
        time.sleep(0.01)
    ckpt.write_bytes(ckpt.read_bytes()[:20])  # the newest was cut off by the kill during its write: skipped
    assert _fit_cmd("inject.yaml", root, []).args()[-2:] == ["--ckpt_path", "last"]
    # what the CLI resolves `last` to under the stage's root (cli.py: the same function)
    assert latest_checkpoint(root) == root / "lightning_logs" / "version_1" / "checkpoints" / "last.ckpt"


def test_lacuna_run_prints_each_verdict_once_and_writes_the_full_result_to_a_file(tmp_path, monkeypatch, capsys):
    """The command's stdout is a short closing block (one line per verdict, the result file's name), not JSON; the
    full result is in ``<workdir>/chain_result.json``."""
    from lightning_unlearn.workflows.lacuna import chain
    from lightning_unlearn.workflows.lacuna.commands import main

    sizes = {f"{f}/{s}": 9 for f in TARGET_FIELDS for s in FIELD_SPLITS} | {"relearn": 40}
    masked = {"profiles": 18, "extraction": dict.fromkeys(TARGET_FIELDS, 0.75), "split_sizes": sizes}
    thresholds = {"forgotten_max": 0.1, "kept_min": 0.8, "utility_max_delta": 0.05}
    separability = {"met": False, "thresholds": thresholds, "utility": {"met": True, "delta": 0.01},
                    "resets": {"group 0": {"met": False}, "m^F": {"met": True}}}  # fmt: skip
    monkeypatch.setattr(chain, "run_chain", lambda *a, **k: {"masked": masked, "separability": separability})
    main(["run", "--workdir", str(tmp_path)])
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "chain_result.json").read_text())
    assert result["masked"] == masked["extraction"]
    assert result["separability"] == {"met": False, "utility": separability["utility"], "group 0": False, "m^F": True}
    assert printed.count("target (masked, ≥ 50% on ≥ 2 fields): met") == 1
    assert printed.count("splits (≥ 8 forget and ≥ 8 retain pairs for every field): met") == 1
    assert printed.count(": NOT met (group 0)") == 1 and "{" not in printed
    assert printed.rstrip().endswith(str(tmp_path / "chain_result.json"))
    assert [line.removeprefix("  ") for line in printed.splitlines()[1:4]] == [
        v.removeprefix("[lacuna] ") for v in result["verdicts"].values()
    ]


@pytest.mark.slow
def test_the_default_preset_builds_two_groups_with_the_separable_recipe(tiny_dir, tmp_path):
    """``--size default``: data of two groups of 16 people, injected through lacuna/inject_separable.yaml (here cut
    to 4 steps by a further overlay), and every group-aware step reads the two groups: the split table (forget group
    0, retain group 1) and the separability resets (each group, m^F = {0}, m^R = {1})."""
    short = tmp_path / "short.yaml"
    short.write_text(
        "trainer: {max_steps: 4, limit_val_batches: 0}\n"
        "model:\n  init_args:\n    drop_other_groups: [[0, 1.0], [2, 0.5]]\n"
        "    optim: {warmup_steps: 1, cycles: [[2, 1.0], [2, 0.5]]}\n"
    )
    lines: list[str] = []
    reports = run_chain(str(tmp_path / "w"), size="default", model_path=str(tiny_dir), inject_configs=[short],
                        log=lines.append)  # fmt: skip
    w = tmp_path / "w"
    manifest = json.loads((w / "data" / "manifest.json").read_text())
    assert (manifest["num_groups"], manifest["num_profiles"]) == (2, 32)
    config = yaml.safe_load((w / "inject" / "lightning_logs" / "version_0" / "config.yaml").read_text())
    model, data = config["model"]["init_args"], config["data"]["init_args"]
    assert (model["coverage"], model["num_groups"], data["hold_other_groups"]) == (0.15, 2, 0.25)
    assert model["drop_other_groups"] == [[0, 1.0], [2, 0.5]] and config["trainer"]["max_steps"] == 4
    # the recipe's cheaper step (§9h) stays on under a further overlay that sets other optimizer fields
    assert model["held_cache_gib"] == 1.0 and model["optim"]["fused"] is True and model["optim"]["lr"] == 0.003
    assert any("forget: groups 0, retain: groups 1" in line for line in lines)
    resets = reports["separability"]["resets"]
    assert {name: r["groups"] for name, r in resets.items()} == {"group 0": [0], "group 1": [1], "m^F": [0], "m^R": [1]}
