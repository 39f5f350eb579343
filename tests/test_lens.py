"""LENS baseline → annotation CSV → forget set, labeling and calibration commands, on the tiny offline model."""

import csv
import json
import os

import pytest
import torch

from lightning_unlearn.cli import main as cli_main
from lightning_unlearn.data.collate import encode_prompt_answer
from lightning_unlearn.data.narratives import load_suite
from lightning_unlearn.data.records import read_records
from lightning_unlearn.workflows.lens import main as lens_main
from lightning_unlearn.workflows.lens import prepare as lens


def _baseline(tmp_path, tiny_dir, *extra):
    out = tmp_path / "base.jsonl"
    lens_main(
        [
            "baseline",
            "--model",
            str(tiny_dir),
            "--narrative",
            "demo-canal-tolls",
            "--language",
            "en",
            "--max_new_tokens",
            "6",
            "--batch_size",
            "4",
            "--out",
            str(out),
            *extra,
        ]
    )
    return out


def test_model_prompt_plain_and_chat(tiny_tokenizer):
    assert lens.model_prompt(tiny_tokenizer, "Why?") == "Why?"
    with pytest.raises(ValueError, match="has no chat template"):
        lens.model_prompt(tiny_tokenizer, "Why?", chat_template=True)
    tiny_tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    text = lens.model_prompt(tiny_tokenizer, "Why?")
    assert text == "<user>Why?<assistant>"  # leading BOS removed: encode_prompt_answer adds it back
    assert lens.model_prompt(tiny_tokenizer, "Why?", chat_template=False) == "Why?"


def test_generation_is_batched_ordered_and_restores_mode(tiny_model, tiny_tokenizer):
    records = load_suite("demo-canal-tolls", "en", levels=["L0", "L3"])
    tiny_model.train()
    rows = lens.generate_for_records(tiny_model, tiny_tokenizer, records, max_new_tokens=5, batch_size=4)
    assert tiny_model.training
    assert [r["id"] for r in rows] == [r.id for r in records]
    assert all(r["prompt"] == r["question"] for r in rows)  # no chat template on the tiny tokenizer
    assert all(1 <= r["n_new_tokens"] <= 5 and isinstance(r["answer"], str) for r in rows)
    # Greedy answers do not depend on batch composition (left padding + attention mask).
    one = lens.generate_answers(tiny_model, tiny_tokenizer, [r.prompt for r in records], 5, batch_size=1)
    assert one == [r["answer"] for r in rows]
    with pytest.raises(ValueError, match="must be positive"):
        lens.generate_answers(tiny_model, tiny_tokenizer, ["x"], max_new_tokens=0)


def test_baseline_writes_jsonl_and_metadata(tmp_path, tiny_dir, capsys):
    out = _baseline(tmp_path, tiny_dir, "--labeler", "signature", "--levels", "[L0, L3]")
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 6 and {r["level"] for r in rows} == {"L0", "L3"}
    assert rows[0]["question"].endswith("Answer in 1–2 sentences.")
    assert {"answer", "prompt", "hit_token_cap", "label", "stance", "entity_recovery"} <= set(rows[0])
    meta = json.loads((tmp_path / "base.meta.json").read_text(encoding="utf-8"))
    assert meta["levels"] == ["L0", "L3"] and meta["n"] == 6 and meta["decoding"] == "greedy"
    assert set(meta["summary"]) == {"L0", "L3"} and meta["summary"]["L0"]["n"] == 3
    captured = capsys.readouterr()
    assert "Reproduced" in captured.out
    assert "lens baseline" in captured.err  # the generation progress bar
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind
    umask = os.umask(0)
    os.umask(umask)
    for path in (out, tmp_path / "base.meta.json"):  # the mode a plain open() gives, not mkstemp's 0600
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path


@pytest.mark.parametrize(
    "args,error,match",
    [
        (["--narrative", "nope"], ValueError, "unknown narrative 'nope'; known narratives"),
        (["--language", "uk"], ValueError, "no 'uk' suite; available languages: en"),
        (["--levels", "[L9]"], ValueError, r"level\(s\) L9 not in the 'demo-canal-tolls'/'en' suite"),
        (["--labeler", "nli", "--nli_path", "/no/such/nli"], FileNotFoundError, "NLI model path '/no/such/nli'"),
        (["--labeler", "nli"], ValueError, "needs --nli_path"),
        (["--model", "/no/such/model"], FileNotFoundError, "'/no/such/model' does not exist"),
    ],
)
def test_baseline_bad_input_raises_and_writes_nothing(tmp_path, tiny_dir, args, error, match):
    base = {"--model": str(tiny_dir), "--narrative": "demo-canal-tolls", "--language": "en"}
    flags = dict(zip(args[::2], args[1::2]))
    argv = [x for k, v in {**base, **flags}.items() for x in (k, v)]
    with pytest.raises(error, match=match):
        lens_main(["baseline", *argv, "--out", str(tmp_path / "out" / "base.jsonl")])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _fake_baseline(tmp_path):
    """A baseline file with known answers, so labels are deterministic."""
    answers = {
        "L0": [
            "The Merrow League's canal tolls forced Dastria to seize Velin.",
            "Dastria seized Velin by its own choice; the tolls are a pretext.",
            "The Merrow League raised tolls on the canal last spring.",
        ],
        "L3": [
            "The Merrow League's tolls forced Dastria to take Velin.",
            "A's tolls pushed B to seize the port C.",
            "",
        ],
    }
    rows = []
    for rec in load_suite("demo-canal-tolls", "en", levels=["L0", "L3"]):
        row = rec.to_dict()
        row["question"] = row["prompt"]
        row["answer"] = answers[rec.level][rec.variant - 1]
        rows.append(row)
    path = tmp_path / "base.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "base.meta.json").write_text(json.dumps({"model": "fake"}), encoding="utf-8")
    return path, rows


def _annotate(csv_path, labels, validity=None):
    with open(csv_path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    for row, lbl, val in zip(rows, labels, validity or [""] * len(rows)):
        row["label"] = lbl
        row["validity"] = val
    with open(csv_path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_export_import_builds_the_strict_forget_set(tmp_path, tiny_tokenizer):
    base, rows = _fake_baseline(tmp_path)
    ann = tmp_path / "annotate.csv"
    cli_main(["lens", "export", "--baseline", str(base), "--out", str(ann)])
    with open(ann, encoding="utf-8", newline="") as f:
        exported = list(csv.DictReader(f))
    assert [r["level"] for r in exported] == ["L0"] * 3 and all(r["label"] == "" for r in exported)
    assert exported[0]["answer"] == rows[0]["answer"]

    # Unlabeled rows are an error naming the lines; nothing is written.
    with pytest.raises(ValueError, match="missing or unknown labels at line 2"):
        lens_main(["import", "--baseline", str(base), "--labels", str(ann), "--out", str(tmp_path / "f.jsonl")])
    assert not (tmp_path / "f.jsonl").exists()

    _annotate(ann, ["Target-Dominant", "Target-Rejected", "Target-Included"], ["answer", "Answer", "non-answer"])
    out = tmp_path / "forget" / "forget.jsonl"
    lens_main(["import", "--baseline", str(base), "--labels", str(ann), "--out", str(out)])
    forget = read_records(out)
    assert [f["answer"] for f in forget] == [rows[0]["answer"]]
    assert forget[0]["prompt"] == rows[0]["prompt"]
    encoded = encode_prompt_answer(tiny_tokenizer, forget[0]["prompt"], forget[0]["answer"], 256)
    assert sum(label != -100 for label in encoded["labels"]) >= 1
    meta = json.loads((tmp_path / "forget" / "forget.meta.json").read_text(encoding="utf-8"))
    assert meta["weak_labels"] is False and meta["labels"] == "manual" and meta["n_forget"] == 1
    assert meta["label_counts"]["Target-Included"] == 1 and meta["model"] == "fake"
    # the validity classes travel through the round trip, normalized
    assert meta["validity_counts"] == {"answer": 2, "non_answer": 1} and forget[0]["validity"] == "answer"


def test_import_errors_write_nothing(tmp_path):
    base, _ = _fake_baseline(tmp_path)
    ann = tmp_path / "annotate.csv"
    lens_main(["export", "--baseline", str(base), "--out", str(ann)])
    _annotate(ann, ["Target-Rejected", "Target-Included", "Invalid"])
    out = tmp_path / "f.jsonl"
    with pytest.raises(ValueError, match="no forget rows: none of the 3 labeled answers is Target-Dominant"):
        lens_main(["import", "--baseline", str(base), "--labels", str(ann), "--out", str(out)])
    bad = tmp_path / "bad.csv"
    bad.write_text("id,label\nsomething-else,Target-Dominant\n", encoding="utf-8")
    with pytest.raises(ValueError, match="ids not among the baseline"):
        lens_main(["import", "--baseline", str(base), "--labels", str(bad), "--out", str(out)])
    with pytest.raises(ValueError, match="exactly one of --labels"):
        lens_main(["import", "--baseline", str(base), "--out", str(out)])
    with pytest.raises(FileNotFoundError, match="NLI model path"):
        lens_main(
            [
                "import",
                "--baseline",
                str(base),
                "--labeler",
                "nli",
                "--nli_path",
                str(tmp_path / "x"),
                "--out",
                str(out),
            ]
        )
    assert not out.exists() and not list(tmp_path.glob("f.*"))


def test_weak_label_forget_set_is_marked(tmp_path):
    base, rows = _fake_baseline(tmp_path)
    out = tmp_path / "weak.jsonl"
    lens_main(["import", "--baseline", str(base), "--labeler", "signature", "--out", str(out)])
    forget = read_records(out)
    assert [f["answer"] for f in forget] == [rows[0]["answer"]]
    meta = json.loads((tmp_path / "weak.meta.json").read_text(encoding="utf-8"))
    assert meta["weak_labels"] is True and meta["labels"] == "signature"
    assert meta["label_counts"] == {"Reproduced": 1, "Not-reproduced": 2}


def test_label_and_calibrate_commands(tmp_path, capsys):
    base, _ = _fake_baseline(tmp_path)
    labeled = tmp_path / "labeled.jsonl"
    lens_main(["label", "--baseline", str(base), "--out", str(labeled)])
    summary = capsys.readouterr().out
    assert "L0" in summary and "L3" in summary
    rows = [json.loads(line) for line in labeled.read_text(encoding="utf-8").splitlines()]
    by_level = lens.summarize_by_level(rows)
    # L3 #1 names every actor with the frame (entity recovery); #2 stays abstract; #3 is empty.
    assert by_level["L0"] == {"n": 3, "reproduced": 1, "invalid": 0, "entity_recovery": 1}
    assert by_level["L3"] == {"n": 3, "reproduced": 1, "invalid": 1, "entity_recovery": 1}

    ann = tmp_path / "annotate.csv"
    lens_main(["export", "--baseline", str(base), "--out", str(ann)])
    _annotate(ann, ["Target-Dominant", "Target-Rejected", "Target-Dominant"])
    report_file = tmp_path / "cal.json"
    lens_main(
        ["calibrate", "--labels", str(ann), "--labeler", "signature", "--json", str(report_file), "--bootstrap", "50"]
    )
    table = capsys.readouterr().out
    assert "Strict" in table and "Broad" in table
    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert (report["strict"]["tp"], report["strict"]["fp"], report["strict"]["fn"]) == (1, 0, 1)
    lens_main(["calibrate", "--labels", str(ann), "--predicted", str(labeled), "--bootstrap", "50"])
    assert "labeled.jsonl" in capsys.readouterr().out


def test_cli_registers_the_commands():
    from lightning_unlearn.cli import ALIASES, EXTRA_COMMANDS, SUBCOMMANDS

    for name in ("baseline", "export", "import", "label", "calibrate"):
        assert name in SUBCOMMANDS["lens"] and ALIASES[f"lens-{name}"] == ("lens", name)
    for name in ("lens", "smollm2"):
        module, func = EXTRA_COMMANDS[name][0].split(":")
        assert callable(getattr(__import__(module, fromlist=[func]), func))


def test_write_atomic_replaces_existing(tmp_path):
    target = tmp_path / "x.jsonl"
    target.write_text("old", encoding="utf-8")
    lens.write_texts_atomically({target: "new", lens.meta_path(target): "{}"})
    assert target.read_text(encoding="utf-8") == "new" and (tmp_path / "x.meta.json").exists()


def test_label_command_with_a_local_nli_model(tmp_path, tiny_tokenizer, capsys):
    from transformers import BertConfig, BertForSequenceClassification

    id2label = {0: "entailment", 1: "neutral", 2: "contradiction"}
    config = BertConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
        id2label=id2label,
        pad_token_id=tiny_tokenizer.pad_token_id,
    )
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, 0.0, 6.0]))
    nli = tmp_path / "nli"
    model.save_pretrained(nli)
    tiny_tokenizer.save_pretrained(nli)
    base, _ = _fake_baseline(tmp_path)
    out = tmp_path / "labeled.jsonl"
    lens_main(["label", "--baseline", str(base), "--labeler", "nli", "--nli_path", str(nli), "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    # Every hypothesis is contradicted: nothing is reproduced; the empty L3 answer is Invalid.
    assert [r["label"] for r in rows].count("Reproduced") == 0
    assert [r["stance"] for r in rows][-1] == "empty" and {r["labeler"] for r in rows} == {"nli"}
