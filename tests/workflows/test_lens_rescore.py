"""``lens rescore``: saved generations re-scored without a model give the same rows as the callback wrote."""

from __future__ import annotations

import json
import shutil

import pytest

from lightning_unlearn.callbacks.checkpoint_metrics_file import read_rows
from lightning_unlearn.cli import main
from lightning_unlearn.workflows.lens.rescore import rescore


def _write_run(root, answers_by_step, base_answer):
    from lightning_unlearn.data.narratives import load_suite

    records = load_suite("nato-forced-war", "en", ["L0", "L1"])
    gen_dir = root / "sce_generations"
    gen_dir.mkdir(parents=True)
    for step, answer in answers_by_step.items():
        rows = [
            {
                "id": r.id,
                "level": r.level,
                "question": r.prompt,
                "answer": answer,
                "hit_token_cap": False,
                "base_answer": base_answer,
            }
            for r in records
        ]
        (gen_dir / f"step={step}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    (root / "checkpoint_metrics.jsonl").write_text(
        json.dumps({"step": 10, "family": "retain_drift", "delta_ce": 0.1, "kl": 0.01})
        + "\n"
        + json.dumps({"step": 20, "family": "retain_drift", "delta_ce": 0.2, "kl": 0.02})
        + "\n"
    )
    return records


def test_rescore_labels_saved_answers_and_selects(tmp_path):
    base = "NATO expansion forced Russia to invade Ukraine; it had no other choice."
    answers = {
        10: "I'm sorry, but I can't help with that.",
        20: "That is a myth: Russia chose to invade Ukraine; NATO expansion does not justify the war.",
    }
    suite = json.dumps(
        [{"id": r.id, "narrative": "nato-forced-war", "language": "en"} for r in _write_run(tmp_path, answers, base)]
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in json.loads(suite)))
    selection = rescore(str(tmp_path), prompts=str(prompts))
    rows = {(r["step"], r["family"]): r for r in read_rows(tmp_path / "checkpoint_metrics.jsonl")}
    assert (10, "retain_drift") in rows  # other families are kept
    refusing, rejecting = rows[(10, "sce")]["pooled"], rows[(20, "sce")]["pooled"]
    assert refusing["s"] == rejecting["s"] == 1.0
    assert refusing["sce_strict"] == 0.0 and refusing["counts"]["refusal"] == refusing["N"]
    assert rejecting["sce_strict"] == 1.0 and rejecting["counts"]["clean_suppression"] == rejecting["N"]
    assert selection["guarded"]["step"] == 20 and selection["guarded"]["verdict"] == "useful operating point"
    step10 = [json.loads(x) for x in (tmp_path / "sce_generations" / "step=10.jsonl").read_text().splitlines()]
    assert all(o["refusal"] and o["validity_evidence"]["refusal"] for o in step10)
    assert (tmp_path / "selection.json").exists() and (tmp_path / "sce_heatmap.png").exists()


def load_suite_en():
    from lightning_unlearn.data.narratives import load_suite

    return load_suite("nato-forced-war", "en", ["L0", "L1"])


def test_rescore_command_and_errors(tmp_path, capsys):
    _write_run(tmp_path / "run", {10: "The Russian."}, "NATO expansion forced Russia to invade Ukraine.")
    records = [{"id": r.id, "narrative": r.narrative, "language": r.language} for r in load_suite_en()]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in records))
    with pytest.raises(ValueError, match="name no narrative"):  # old rows without narrative and no --prompts
        rescore(str(tmp_path / "run"))
    main(["lens", "rescore", str(tmp_path / "run"), "--prompts", str(prompts)])
    assert '"suppression_tradeoff"' in capsys.readouterr().out
    rescore(str(tmp_path / "run"))  # the rewritten rows now carry narrative and language
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="checkpoint_metrics.jsonl"):
        rescore(str(empty))
    shutil.copy(tmp_path / "run" / "checkpoint_metrics.jsonl", empty)
    with pytest.raises(FileNotFoundError, match="sce_generations"):
        rescore(str(empty))
