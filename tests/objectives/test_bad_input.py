"""Every user mistake is one line on stderr, a non-zero exit and an untouched run directory.

Each case runs ``lightning-unlearn`` in a fresh directory holding only what the case wrote there; afterwards stderr's
last line must name the problem, no stderr line may start a traceback, and the directory must be byte-for-byte as
before (no ``run/``, no logger version, no lock). Each case is its own process (``tests/cli_processes.py``: a child
forked from one interpreter that imported torch, Lightning and transformers once, running ``python -m
lightning_unlearn.cli`` as the interpreter does, exit status and stderr included); one of them also runs from a cold
start, the command line end to end.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Imported at collection, not inside a test: Lightning's loggers keep the stderr of the moment they are first
# imported, and a test's captured stderr is closed when that test ends.
from lightning_unlearn.cli import main
from tests.cli_processes import CommandProcesses

CLI = [sys.executable, "-m", "lightning_unlearn.cli"]


def _fit(testbed) -> list[str]:
    base = Path(testbed.root) / "bad_input_base.yaml"
    if not base.exists():
        base.write_text(
            "trainer:\n  max_steps: 2\n  enable_progress_bar: false\n"
            f"model:\n  init_args:\n    model_path: {testbed.model_dir}\n"
            f"data:\n  init_args:\n    tokenizer_path: {testbed.model_dir}\n    forget_path: {testbed.forget}\n"
            f"    retain_path: {testbed.retain}\n    batch_size: 2\n",
            encoding="utf-8",
        )
    return [*CLI, "fit", "-c", "lens/npo.yaml", "-c", str(base), "--trainer.default_root_dir", "run"]


def _sweep(testbed, root: str, key: str) -> str:
    return (f"root: {root}\nbase: [lens/npo.yaml, {Path(testbed.root) / 'bad_input_base.yaml'}]\n"
            f"grid:\n  {key}: [0.1, 0.2]\n")  # fmt: skip


def _mask_auc(testbed) -> list[str]:
    return [*CLI, "mask-auc", "--pre", testbed.model_dir, "--inj", testbed.model_dir, "--unl", testbed.model_dir,
            "--masks", testbed.masks]  # fmt: skip


def _other_architecture(testbed) -> str:
    """A model of another width beside the testbed's (built once)."""
    from lightning_unlearn.models import TinyLlamaConfig, build_tiny_llama

    other = Path(testbed.root) / "other_architecture"
    if not other.exists():
        config = TinyLlamaConfig(hidden_size=16, num_layers=4, num_heads=2, intermediate_size=32)
        build_tiny_llama(testbed.tokenizer, config).save_pretrained(other)
    return str(other)


# name: (extra words or a whole command, {file: content written first}, regex stderr's last line must match)
CASES = {
    "model path is the weights file": (
        lambda tb: [*_fit(tb), "--model.init_args.model_path", f"{tb.model_dir}/model.safetensors"],
        {},
        r"model\.safetensors' is a file, not a model directory; give the directory",
    ),
    "nan learning rate in a YAML": (
        lambda tb: [*_fit(tb), "-c", "lr.yaml"],
        {"lr.yaml": "model:\n  init_args:\n    optim:\n      lr: .nan\n"},
        r"optim\.lr must be a positive finite number, got nan",
    ),
    "infinite learning rate in a YAML": (
        lambda tb: [*_fit(tb), "-c", "lr.yaml"],
        {"lr.yaml": "model:\n  init_args:\n    optim:\n      lr: .inf\n"},
        r"optim\.lr must be a positive finite number, got inf",
    ),
    "negative learning rate on the command line": (
        lambda tb: [*_fit(tb), "--model.init_args.optim.lr", "-1e-3"],
        {},
        r"optim\.lr must be a positive finite number, got -0\.001",
    ),
    "forget file that is not UTF-8": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.jsonl"],
        {"f.jsonl": b'{"prompt": "\xff\xfe", "answer": "x"}\n'},
        r"f\.jsonl:1 is not UTF-8 text \(byte 0xff at offset 12\); re-save the file as UTF-8",
    ),
    "null prompt": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.jsonl"],
        {"f.jsonl": '{"prompt": null, "answer": "x"}\n'},
        r"forget set record 0 of 'f\.jsonl' has a null 'prompt'; fill it in or drop the record",
    ),
    "max_length 0": (
        lambda tb: [*_fit(tb), "--data.init_args.max_length", "0"],
        {},
        r"data\.max_length=0 leaves no room for a pair: it needs at least 4 tokens",
    ),
    "run directory under a file": (
        lambda tb: [*_fit(tb)[:-1], "afile/run"],
        {"afile": "x"},
        r"Not a directory: 'afile/run'; a parent of that path is a file: choose another directory",
    ),
    "a YAML syntax error": (
        lambda tb: [*_fit(tb), "-c", "bad.yaml"],
        {"bad.yaml": "model:\n  init_args: [\n"},
        r"bad\.yaml:3:1: not valid YAML \(expected the node content",
    ),
    "a misspelt model key": (
        lambda tb: [*_fit(tb), "--model.init_args.betaa", "0.5"],
        {},
        r"--model\.init_args\.betaa is not an option of .*NPO; did you mean --model\.init_args\.beta\?",
    ),
    "a misspelt nested key in a YAML": (
        lambda tb: [*_fit(tb), "-c", "typo.yaml"],
        {"typo.yaml": "model:\n  init_args:\n    optim:\n      lrr: 0.1\n"},
        r"--model\.init_args\.optim\.lrr is not an option of .*OptimizerConfig; "
        r"did you mean --model\.init_args\.optim\.lr\?",
    ),
    "a misspelt trainer key": (
        lambda tb: [*_fit(tb), "--trainer.max_stepz", "3"],
        {},
        r"--trainer\.max_stepz is not an option; did you mean --trainer\.max_steps\?",
    ),
    "a checkpoint that does not exist": (
        lambda tb: [*_fit(tb), "--ckpt_path", "nope.ckpt"],
        {},
        r"--ckpt_path nope\.ckpt: no such checkpoint file",
    ),
    "an accelerator this machine lacks": (
        lambda tb: [*_fit(tb), "--trainer.accelerator", "cuda"],
        {},
        r"`CUDAAccelerator` can not run on your system",
    ),
    "masks that are not safetensors": (
        lambda tb: [
            *CLI,
            "mask-auc",
            "--pre",
            tb.model_dir,
            "--inj",
            tb.model_dir,
            "--unl",
            tb.model_dir,
            "--masks",
            "m.txt",
        ],  # fmt: skip
        {"m.txt": "not safetensors"},
        r"masks file 'm\.txt' is not a safetensors file",
    ),
    "a learning rate that is not a number": (
        lambda tb: [*_fit(tb), "--model.init_args.optim.lr", "fast"],
        {},
        r"--model\.init_args\.optim\.lr: 'fast' is not a float; give a float there",
    ),
    "an objective class that does not exist": (
        lambda tb: [*_fit(tb), "--model.class_path", "lightning_unlearn.objectives.NPOO"],
        {},
        r"--model\.class_path 'lightning_unlearn\.objectives\.NPOO' cannot be imported \(module "
        r"'lightning_unlearn\.objectives' has no attribute 'NPOO'\); did you mean lightning_unlearn\.objectives\.NPO\?",
    ),
    "a beta that is text in a YAML": (
        lambda tb: [*_fit(tb), "-c", "b.yaml"],
        {"b.yaml": "model:\n  init_args:\n    beta: high\n"},
        r"--model\.init_args\.beta: 'high' is not a float",
    ),
    "max_steps that is text": (
        lambda tb: [*_fit(tb), "--trainer.max_steps", "ten"],
        {},
        r"--trainer\.max_steps: 'ten' is not an int; give an int there",
    ),
    # Misleading before: what is actually wrong, said.
    "a forget file that is a spreadsheet": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "forget.xlsx"],
        {"forget.xlsx": b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00\xff"},
        r"forget\.xlsx is a ZIP archive \(a spreadsheet such as \.xlsx .*\), not text; save the records as JSON Lines",
    ),
    "lacuna run with a size that does not exist": (
        lambda tb: [*CLI, "lacuna", "run", "--size", "nonsense", "--workdir", "w"],
        {},
        r"lacuna run: error: --size 'nonsense' is not one of 'default', 'six_groups', 'tiny'",
    ),
    "report with a metric that does not exist": (
        lambda tb: [*CLI, "report", "r", "--metric", "sce_bogus"],
        {},
        r"report: error: --metric 'sce_bogus' is not one of 'sce', 'sce_health', 'sce_strict'",
    ),
    "lacuna localization on an empty work directory": (
        lambda tb: [*CLI, "lacuna", "localization", "--workdir", "empty"],
        {"empty/.keep": ""},
        r"'empty' holds no Lacuna testbed \(no chain\.json, no inject/export\); build one there first",
    ),
    "a run directory that is a file": (
        lambda tb: [*_fit(tb)[:-1], "afile"],
        {"afile": "x"},
        r"fit: error: File exists: 'afile'; that path is a file, not a directory: choose a directory",
    ),
    # A second look: mistakes no earlier list named.
    "an empty forget file": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.jsonl"],
        {"f.jsonl": ""},
        r"the forget set 'f\.jsonl' holds no record; give at least one",
    ),
    "the retain file given as the forget file": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", tb.retain],
        {},
        r"the forget set \(.*retain\.jsonl\) and the retain set \(.*retain\.jsonl\) hold the same \d+ pairs: "
        r"unlearning would push each answer down and up at once",
    ),
    "batch size 0": (
        lambda tb: [*_fit(tb), "--data.init_args.batch_size", "0"],
        {},
        r"batch_size must be positive, got 0",
    ),
    "a checkpoint path that is a directory": (
        lambda tb: [*_fit(tb), "--ckpt_path", "d"],
        {"d/x": ""},
        r"--ckpt_path d is a directory but not a sharded checkpoint \(no meta\.pt in it\); give a saved \*\.ckpt",
    ),
    "ckpt_path last in a new directory": (
        lambda tb: [*_fit(tb), "--ckpt_path", "last"],
        {},
        r"--ckpt_path last, but 'run' holds no checkpoint to resume",
    ),
    "a sweep grid key with no values": (
        lambda tb: (_fit(tb), [*CLI, "sweep", "s.yaml"])[1],
        {"s.yaml": lambda tb: _sweep(tb, "sw", "model.init_args.beta").replace("[0.1, 0.2]", "[]")},
        r"grid\.model\.init_args\.beta must be a non-empty list of values",
    ),
    "a model path holding no model": (
        lambda tb: [*_fit(tb), "--model.init_args.model_path", "tok"],
        {"tok/readme.txt": "x"},
        r"tokenizer path .tok. holds no tokenizer \(none of tokenizer\.json, tokenizer_config\.json, …\); point at",
    ),
    "a learning rate of zero": (
        lambda tb: [*_fit(tb), "--model.init_args.optim.lr", "0"],
        {},
        r"optim\.lr must be a positive finite number, got 0",
    ),
    "records without a prompt": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.jsonl"],
        {"f.jsonl": '{"answer": "Alice"}\n'},
        r"record 0 of 'f\.jsonl' lacks column\(s\) \['prompt'\]; it has \['answer'\]\. Name the columns with "
        r"prompt_key",
    ),
    "a seed that is text": (
        lambda tb: [*_fit(tb), "--seed_everything", "abc"],
        {},
        r"--seed_everything: 'abc' is none of bool, int",
    ),
    "LoRA rank 0": (
        lambda tb: [*_fit(tb), "--model.init_args.adapter.r", "0"],
        {},
        r"adapter\.r must be positive, got 0",
    ),
    "negative max_steps other than -1": (
        lambda tb: [*_fit(tb), "--trainer.max_steps", "-5"],
        {},
        r"`max_steps` must be a non-negative integer or -1",
    ),
    "a forget file that does not exist": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "nowhere.jsonl"],
        {},
        r"forget set 'nowhere\.jsonl' does not exist; give a JSONL, JSON, CSV or Parquet file or a datasets folder",
    ),
    "a config file that does not exist": (
        lambda tb: [*_fit(tb), "-c", "nowhere.yaml"],
        {},
        r"Parser key \"config\": File does not exist: '.*nowhere\.yaml'",
    ),
    "a YAML config that is a list": (
        lambda tb: [*_fit(tb), "-c", "l.yaml"],
        {"l.yaml": "- a\n- b\n"},
        r"l\.yaml holds a YAML list; a config is a mapping of keys \(trainer:, model:, data:",
    ),
    "a JSON array of strings as records": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.json"],
        {"f.json": '["Alice", "Bob"]'},
        r"forget set record 0 of 'f\.json' is a str, not an object with columns",
    ),
    "a CSV without an answer column": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.csv"],
        {"f.csv": "prompt,reply\nWho?,Alice\n"},
        r"lacks column\(s\) \['answer'\]; it has \['prompt', 'reply'\]",
    ),
    "an unknown adapter kind": (
        lambda tb: [*_fit(tb), "--model.init_args.adapter.kind", "qlora"],
        {},
        r"adapter\.kind='qlora' is not one of 'full', 'lora', 'adalora'",
    ),
    "an unknown lr schedule": (
        lambda tb: [*_fit(tb), "--model.init_args.optim.schedule", "cosine_warm"],
        {},
        r"optim\.schedule='cosine_warm' is not one of",
    ),
    "retain weight that is negative": (
        lambda tb: [*_fit(tb), "--model.init_args.retain_weight", "-1"],
        {},
        r"retain_weight=-1\.0 must be a finite weight >= 0 \(a negative one turns its term's descent into ascent\)",
    ),
    "evaluate on a folder that is not a run": (
        lambda tb: [*CLI, "evaluate", "notarun"],
        {"notarun/x": ""},
        r"notarun/config\.yaml not found; LightningCLI saves",
    ),
    "report on a folder without rows": (
        lambda tb: [*CLI, "report", "empty"],
        {"empty/x": ""},
        r"no checkpoint_metrics\.jsonl under 'empty'; is it a run",
    ),
    "evaluate of a run whose starting model is gone": (
        lambda tb: [*CLI, "evaluate", "run"],
        {"run/config.yaml": "model:\n  init_args:\n    model_path: gone_model\n", "run/step=2.ckpt": ""},
        r"evaluate: the run's starting model 'gone_model' \(model\.init_args\.model_path in .*config\.yaml\) is "
        r"gone; restore it there, or give its new place with --overrides",
    ),
    # Group mismatches of the localization AUC: the testbed's masks hold groups 0-5.
    "mask-auc retain groups the masks lack": (
        lambda tb: [*_mask_auc(tb), "--forget_groups", "[0]", "--retain_groups", "[5, 6, 7]"],
        {},
        r"--retain_groups \[5, 6, 7\]: the masks '.*masks\.safetensors' hold groups \[0, 1, 2, 3, 4, 5\], "
        r"not \[6, 7\]; choose among them \(or \[\] for no AUC\(F\|R\)\)",
    ),
    "mask-auc forget and retain groups that overlap": (
        lambda tb: [*_mask_auc(tb), "--forget_groups", "[0, 1]", "--retain_groups", "[1, 2]"],
        {},
        r"--forget_groups \[0, 1\] and --retain_groups \[1, 2\] share group\(s\) \[1\]; a group is forgotten or "
        r"retained, not both",
    ),
    "mask-auc forget group the masks lack": (
        lambda tb: [*_mask_auc(tb), "--forget_groups", "[9]", "--retain_groups", "[]"],
        {},
        r"--forget_groups \[9\]: the masks .* not \[9\]; choose among them\.",
    ),
    "an unlearned model of another architecture": (
        lambda tb: [
            *CLI,
            "mask-auc",
            "--pre",
            tb.model_dir,
            "--inj",
            tb.model_dir,
            "--unl",
            _other_architecture(tb),
            "--masks",
            tb.masks,
        ],  # fmt: skip
        {},
        r"--unl '.*other_architecture': .* but θ_pre \(--pre .*\) has .*; --unl must be the same architecture",
    ),
    "a sweep key that does not exist": (
        lambda tb: (_fit(tb), [*CLI, "sweep", "s.yaml"])[1],
        {"s.yaml": lambda tb: _sweep(tb, "sw", "model.init_args.betaa")},
        r"override 'model\.init_args\.betaa': 'betaa' is not an option of .*NPO; "
        r"did you mean 'model\.init_args\.beta'\?",
    ),
    "a sweep key two levels under init_args that does not exist": (
        lambda tb: (_fit(tb), [*CLI, "sweep", "s.yaml"])[1],
        {"s.yaml": lambda tb: _sweep(tb, "sw", "model.init_args.optim.lrr")},
        r"override 'model\.init_args\.optim\.lrr': 'lrr' is not an option of .*OptimizerConfig; "
        r"did you mean 'model\.init_args\.optim\.lr'\?",
    ),
    "a sweep root under a file": (
        lambda tb: (_fit(tb), [*CLI, "sweep", "s.yaml"])[1],
        {"afile": "x", "s.yaml": lambda tb: _sweep(tb, "afile/sw", "model.init_args.beta")},
        r"sweep root 'afile/sw': 'afile' is a file",
    ),
    # What YAML and JSON would change without a word: the first of two equal keys dropped, a list trained on as text.
    "a config with two model blocks": (
        lambda tb: [*_fit(tb), "-c", "two.yaml"],
        {
            "two.yaml": "model:\n  init_args:\n    beta: 0.5\ntrainer:\n  max_steps: 2\n"
            "model:\n  init_args:\n    beta: 0.1\n"
        },  # fmt: skip
        r"two\.yaml:6:1: key 'model' is given twice in one mapping \(first on line 1\); YAML would keep only the last",
    ),
    "a sweep file with a key twice": (
        lambda tb: (_fit(tb), [*CLI, "sweep", "s.yaml"])[1],
        {"s.yaml": lambda tb: _sweep(tb, "sw", "model.init_args.beta") + "root: elsewhere\n"},
        r"s\.yaml:5:1: key 'root' is given twice in one mapping \(first on line 1\)",
    ),
    "a sweep grid written as a list": (
        lambda tb: (_fit(tb), [*CLI, "sweep", "s.yaml"])[1],
        {"s.yaml": "root: sw\nbase: [lens/npo.yaml]\ngrid: [0.1, 0.2]\n"},
        r"`grid` must map each dotted key to its list of values",
    ),
    "a sweep file that is not valid YAML": (
        lambda tb: (_fit(tb), [*CLI, "sweep", "s.yaml"])[1],
        {"s.yaml": "root: sw\ngrid: {a: [1\n"},
        r"s\.yaml:3:1: not valid YAML \(expected ',' or '\]', but got '<stream end>'\); fix the file",
    ),
    "a sweep executor with parallel: two": (
        lambda tb: (_fit(tb), [*CLI, "sweep", "s.yaml"])[1],
        {"s.yaml": lambda tb: _sweep(tb, "sw", "model.init_args.beta") + "executor: {parallel: two}\n"},
        r"executor\.parallel='two' must be a positive whole number",
    ),
    "an answer that is a list": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.jsonl"],
        {"f.jsonl": '{"prompt": "Who?", "answer": ["Alice", "Bob"]}\n'},
        r"forget set record 0 of 'f\.jsonl' has 'answer' = \['Alice', 'Bob'\], a list; it must be text",
    ),
    "a suite file with a level key twice": (
        lambda tb: [*CLI, "lens", "suite", "check", "us-abandons-taiwan.json"],
        {"us-abandons-taiwan.json": lambda tb: _suite_with_l0_twice()},
        r"us-abandons-taiwan\.json:\d+: key 'L0' is given twice in languages\.en\.prompts; JSON would keep only the "
        r"last value: merge them into one\.",
    ),
    "a prompt that is an object": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.jsonl"],
        {"f.jsonl": '{"prompt": {"text": "Who?"}, "answer": "Alice"}\n'},
        r"forget set record 0 of 'f\.jsonl' has 'prompt' = \{'text': 'Who\?'\}, a dict; it must be text",
    ),
    "max_steps given twice": (
        lambda tb: [*_fit(tb), "-c", "ms.yaml"],
        {"ms.yaml": "trainer:\n  max_steps: 2\n  max_steps: 3\n"},
        r"ms\.yaml:3:3: key 'max_steps' is given twice in one mapping \(first on line 2\); YAML would keep only "
        r"the last",
    ),
    "a nan learning rate on the command line": (
        lambda tb: [*_fit(tb), "--model.init_args.optim.lr", "nan"],
        {},
        r"--model\.init_args\.optim\.lr: 'nan' is not a finite number; give a finite float there",
    ),
    "a record with a key twice": (
        lambda tb: [*_fit(tb), "--data.init_args.forget_path", "f.jsonl"],
        {"f.jsonl": '{"prompt": "Who?", "answer": "Alice", "answer": "Bob"}\n'},
        r"f\.jsonl:1: key 'answer' is given twice in this record; JSON would keep only the last value",
    ),
}


def _suite_with_l0_twice() -> str:
    """The shipped Taiwan suite with a second ``"L0"`` list written before the first (JSON keeps only the last)."""
    from importlib.resources import files

    text = files("lightning_unlearn.data").joinpath("suites/us-abandons-taiwan.json").read_text(encoding="utf-8")
    return text.replace('"L0": [', '"L0": ["A first block."],\n    "L0": [', 1)


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}  # fmt: skip


@pytest.fixture(scope="module")
def cli():
    """Runs a ``CLI`` command line as its own process (forked from a preloaded interpreter) in a folder."""
    processes = CommandProcesses(
        "lightning_unlearn.cli", ["lightning_unlearn.cli", "lightning_unlearn.objectives", "peft"],
        {"HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    yield processes.run
    processes.close()


def _as_subprocess(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def _check_a_mistake(testbed, tmp_path, name, run) -> None:
    if name == "an accelerator this machine lacks" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    command, files, expected = CASES[name]
    for rel, content in files.items():
        content = content(testbed) if callable(content) else content
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    argv = command(testbed)
    before = _snapshot(tmp_path)
    proc = run(argv, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, (name, proc.stderr[-2000:])
    assert not any(line.startswith("Traceback") for line in lines), proc.stderr[-3000:]
    assert lines and __import__("re").search(expected, lines[-1]), lines[-1:] or proc.stderr
    assert _snapshot(tmp_path) == before  # no run directory, logger version, lock or cell left behind


@pytest.mark.parametrize("name", list(CASES))
def test_a_mistake_is_one_line_and_leaves_nothing(testbed, tmp_path, name, cli):
    _check_a_mistake(testbed, tmp_path, name, cli)


def test_a_mistake_from_a_real_command_line_is_one_line_and_leaves_nothing(testbed, tmp_path):
    # The same checks on one case run as its own Python process: the interpreter's handling of the exit, the
    # package's imports and logging set up from scratch.
    _check_a_mistake(testbed, tmp_path, "a checkpoint that does not exist", _as_subprocess)


def test_configs_copy_into_a_folder_path_creates_the_folder(tmp_path, cli):
    for destination in ("newdir/", "other"):
        proc = cli([*CLI, "configs", "copy", "lens/npo.yaml", destination], tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        folder = tmp_path / destination.rstrip("/")
        assert folder.is_dir() and (folder / "npo.yaml").read_text(encoding="utf-8").startswith("#")


def test_pairs_longer_than_max_length_are_counted_once_or_refused(testbed, caplog):
    from lightning_unlearn.data.unlearning import EncodedPairs
    from lightning_unlearn.models import load_tokenizer

    tokenizer = load_tokenizer(testbed.model_dir)
    records = [{"prompt": "Who is X?", "answer": "word " * 500}, {"prompt": "Who is Y?", "answer": "Paris"}]
    with caplog.at_level("WARNING", logger="lightning_unlearn"):
        pairs = EncodedPairs(records, tokenizer, 32, what="forget set")
    assert len(pairs[0]["input_ids"]) == 32 and len(pairs[1]["input_ids"]) < 32
    (message,) = [r.getMessage() for r in caplog.records if "max_length" in r.getMessage()]
    assert message.startswith("forget set: 1 of 2 pairs are longer than max_length=32 tokens and are cut")
    with pytest.raises(ValueError, match=r"1 of 2 pairs are longer than max_length=32 .*set truncation: warn"):
        EncodedPairs(records, tokenizer, 32, what="forget set", truncation="error")
    assert json.dumps(pairs[1]["labels"])  # the short pair is whole


def test_a_checkpoint_write_that_fails_leaves_the_earlier_one_and_no_temporary(tmp_path, monkeypatch):
    import errno

    from lightning_unlearn.checkpoints import atomic_checkpoint_io

    io = atomic_checkpoint_io()
    last = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 4}, last)
    good = last.read_bytes()

    def full_disk(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"partial")  # what a write cut by a full disk leaves
        raise OSError(errno.ENOSPC, "No space left on device", str(f))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"global_step": 6}, last)
    assert last.read_bytes() == good and sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]
    monkeypatch.undo()
    assert torch.load(last, weights_only=True)["global_step"] == 4


def test_fit_saves_through_the_atomic_checkpoint_io(testbed, tmp_path):
    from lightning_unlearn.cli import UnlearnCLI

    argv = ["-c", str(Path(__file__).parents[2] / "lightning_unlearn/configs/lens/npo.yaml"),
            f"--model.init_args.model_path={testbed.model_dir}", f"--data.init_args.tokenizer_path={testbed.model_dir}",
            f"--data.init_args.forget_path={testbed.forget}", f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    cli = UnlearnCLI(args=argv, run=False)
    assert type(cli.trainer.strategy.checkpoint_io).__name__ == "AtomicCheckpointIO"


def test_a_non_finite_loss_at_the_first_step_exits_non_zero(testbed, tmp_path):
    from lightning_unlearn.models import load_causal_lm, load_tokenizer

    broken = tmp_path / "nan_model"
    model = load_causal_lm(testbed.model_dir)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    model.save_pretrained(broken)
    load_tokenizer(testbed.model_dir).save_pretrained(broken)
    argv = ["fit", "-c", "lens/npo.yaml", f"--model.init_args.model_path={broken}",
            f"--data.init_args.tokenizer_path={broken}", f"--data.init_args.forget_path={testbed.forget}",
            f"--data.init_args.retain_path={testbed.retain}", "--data.init_args.batch_size=2",
            "--trainer.enable_progress_bar=false", "--trainer.max_steps=2",
            f"--trainer.default_root_dir={tmp_path / 'run'}"]  # fmt: skip
    with pytest.raises(SystemExit, match=r"stopped at its first step \(the loss is nan\): nothing was trained") as err:
        main(argv)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("code", ["EROFS", "ENOSPC", "EACCES"])
def test_an_unwritable_run_directory_is_one_line(testbed, tmp_path, monkeypatch, code):
    # As root, a read-only or full directory cannot be made for real: the OS error is raised where fit first
    # writes (the run lock), as the kernel would.
    import errno

    import lightning_unlearn.checkpoints as checkpoints

    def refuse(root):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), str(root))

    monkeypatch.setattr(checkpoints, "acquire_run_lock", refuse)
    argv = ["fit", "-c", "lens/npo.yaml", f"--model.init_args.model_path={testbed.model_dir}",
            f"--data.init_args.tokenizer_path={testbed.model_dir}", f"--data.init_args.forget_path={testbed.forget}",
            f"--data.init_args.retain_path={testbed.retain}",
            f"--trainer.default_root_dir={tmp_path / 'run'}"]  # fmt: skip
    with pytest.raises(SystemExit, match=rf"fit: error: {os.strerror(getattr(errno, code))}: '.*run'; ") as err:
        main(argv)
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()


def _fit_argv(testbed, root: Path, max_steps: int) -> list[str]:
    return ["fit", "-c", "lens/npo.yaml", f"--model.init_args.model_path={testbed.model_dir}",
            f"--data.init_args.tokenizer_path={testbed.model_dir}", f"--data.init_args.forget_path={testbed.forget}",
            f"--data.init_args.retain_path={testbed.retain}", f"--trainer.max_steps={max_steps}",
            "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={root}"]  # fmt: skip


def _used(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="mounting a small tmpfs needs root on Linux")
def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_good_checkpoint(testbed, tmp_path, cli):
    """A real small file system (tmpfs), not a mock: torch's writer fails there with a RuntimeError of its zip
    writer ("unexpected pos"), which must reach the user as the disk being full."""
    measure = tmp_path / "measure"
    assert cli([*CLI, *_fit_argv(testbed, measure, 10)], tmp_path).returncode == 0
    (ckpt,) = measure.rglob("step=10.ckpt")
    # room for everything the first ten steps write and half the next checkpoint
    size_kib = (_used(measure) + ckpt.stat().st_size // 2) // 1024 + 8
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(disk)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"this machine cannot mount a tmpfs ({mounted.stderr.strip()}); the mocked test covers the rest")
    try:
        failed = cli([*CLI, *_fit_argv(testbed, disk / "run", 20)], tmp_path)
        last = failed.stderr.strip().splitlines()[-1]
        assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
        assert "No space left on device" in last and "the last complete checkpoint is kept" in last, last
        (kept,) = (disk / "run").rglob("step=10.ckpt")
        assert torch.load(kept, weights_only=False, map_location="cpu")["global_step"] == 10  # whole and loadable
        assert not list((disk / "run").rglob("*.tmp"))
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], capture_output=True)


@pytest.fixture
def read_only_disk(tmp_path):
    """A real read-only file system (a tmpfs remounted read-only, which refuses even root), holding what the test
    wrote to ``setup`` before; skipped where the machine cannot mount one."""
    disk = tmp_path / "ro"
    disk.mkdir()

    def make(setup) -> Path:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                                 capture_output=True, text=True)  # fmt: skip
        if mounted.returncode != 0:
            pytest.skip(f"this machine cannot mount a tmpfs ({mounted.stderr.strip()})")
        setup(disk)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, capture_output=True)
        return disk

    yield make
    subprocess.run(["umount", "--lazy", str(disk)], capture_output=True)


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="mounting a tmpfs needs root on Linux")
def test_a_read_only_disk_is_one_line_naming_each_commands_own_option(testbed, tmp_path, read_only_disk, cli):
    def setup(disk: Path) -> None:  # a run with its config and a checkpoint file, as evaluate looks for them
        (disk / "run").mkdir()
        (disk / "run" / "config.yaml").write_text("model: {}\n")
        (disk / "run" / "step=2.ckpt").write_bytes(b"")

    disk = read_only_disk(setup)
    before = _snapshot(disk)
    evaluated = cli([*CLI, "evaluate", str(disk / "run")], tmp_path)
    assert evaluated.returncode == 1 and "Traceback" not in evaluated.stderr, evaluated.stderr[-3000:]
    last = evaluated.stderr.strip().splitlines()[-1]
    assert last.startswith(f"lightning-unlearn evaluate: error: Read-only file system: '{disk}"), last
    assert "another run directory" in last
    sweep = tmp_path / "s.yaml"
    sweep.write_text(_sweep(testbed, str(disk / "sw"), "model.init_args.beta"))
    _fit(testbed)  # writes the sweep's base config
    swept = cli([*CLI, "sweep", str(sweep)], tmp_path)
    assert swept.returncode == 1 and "Traceback" not in swept.stderr, swept.stderr[-3000:]
    last = swept.stderr.strip().splitlines()[-1]
    assert "Read-only file system" in last and "the sweep file's root:" in last
    assert "--trainer.default_root_dir" not in last
    assert _snapshot(disk) == before
