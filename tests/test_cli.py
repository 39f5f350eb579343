"""The ``lightning-unlearn`` entry point: LightningCLI for the Trainer commands, and every other command (and its
old spelling) with jsonargparse's ``--help``, ``--print_config`` and ``-c/--config``, and one-line errors."""

import subprocess
import sys

import pytest
import yaml

from lightning_unlearn.cli import ALIASES, EXTRA_COMMANDS, SUBCOMMANDS, main, underscore_flags

pytestmark = pytest.mark.bounds  # run by the lowest-bounds CI job too (scripts/test_lowest.sh)

# Every command as the words that name it: the commands, their subcommands, and the aliases.
COMMANDS = [(name,) for name in EXTRA_COMMANDS] + [(name, sub) for name, subs in SUBCOMMANDS.items() for sub in subs]
ALIAS_COMMANDS = [(alias,) for alias in ALIASES]
# The fewest arguments each runnable command needs to parse (the paths need not exist: --print_config does no work).
MINIMAL = {
    ("report",): ["runs/a", "runs/b"],
    ("sweep",): ["-c", "sweep.yaml"],
    ("evaluate",): ["runs/npo/trajectory", "-c", "eval.yaml"],
    ("mask-auc",): ["--pre", "pre", "--inj", "inj", "--unl", "unl", "--masks", "masks.safetensors"],
    ("smollm2",): [],
    ("attack", "quantize"): ["runs/npo/trajectory"],
    ("attack", "relearn"): ["runs/npo/trajectory"],
    ("lens", "baseline"): ["--model", "m", "--narrative", "nato-forced-war", "--language", "en", "--out", "b.jsonl"],
    ("lens", "export"): ["--baseline", "b.jsonl", "--out", "a.csv"],
    ("lens", "import"): ["--baseline", "b.jsonl", "--out", "f.jsonl"],
    ("lens", "label"): ["--baseline", "b.jsonl", "--out", "l.jsonl"],
    ("lens", "calibrate"): ["--labels", "a.csv"],
    ("lens", "summary"): ["runs/npo"],
    ("lens", "rescore"): ["runs/npo"],
    ("lens", "run"): ["my-suites/my-narrative.json"],
    ("lacuna", "run"): [],
    ("lacuna", "data"): [],
    ("lacuna", "filter"): [],
    ("lacuna", "resurface"): ["--model", "m", "--out", "attack"],
    ("lacuna", "locality"): ["--group", "[2]"],
    ("lacuna", "localization"): [],
    ("lacuna", "reference"): [],
    ("configs", "list"): [],
    ("configs", "copy"): ["lens/npo.yaml", "mine.yaml"],
}


def _words(words: tuple[str, ...]) -> tuple[str, ...]:
    """The canonical command words of ``words`` (an alias stands for its command)."""
    return (*ALIASES.get(words[0], words[:1]), *words[1:])


def _flat(text: str) -> str:
    return " ".join(text.split())


def _exit(argv: list[str], capsys) -> tuple[object, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().out


def test_fit_help_lists_trainer_model_and_data_options():
    out = subprocess.run(
        [sys.executable, "-m", "lightning_unlearn.cli", "fit", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for option in ("--trainer.strategy", "--trainer.num_nodes", "--model", "--data", "--ckpt_path"):
        assert option in out.stdout


@pytest.mark.parametrize("argv", [["--help"], ["-h"], []], ids=["--help", "-h", "no arguments"])
def test_top_level_help_lists_every_command_with_its_description(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == (2 if not argv else 0)  # no arguments: LightningCLI asks for a subcommand
    captured = capsys.readouterr()
    printed = captured.out
    assert "fit" in captured.out + captured.err and "validate" in captured.out + captured.err
    lines = printed.splitlines()
    for name, (target, description) in EXTRA_COMMANDS.items():
        assert description.strip() and ":" in target
        assert f"  {name:<22} {description}" in lines, name
        for sub, sub_description in SUBCOMMANDS.get(name, {}).items():
            assert sub_description.strip() and f"    {sub:<20} {sub_description}" in lines, (name, sub)
    for alias, words in ALIASES.items():
        assert f"  {alias:<22} alias of {' '.join(words)}" in lines
    assert "module:function" not in printed and "lightning_unlearn.workflows" not in printed


@pytest.mark.parametrize("words", COMMANDS + ALIAS_COMMANDS, ids=" ".join)
def test_every_command_has_help_naming_it(words, capsys):
    code, printed = _exit([*words, "--help"], capsys)
    assert code == 0
    usage = _flat(printed.split("\n\n")[0])
    canonical = _words(words)
    assert usage.startswith(f"usage: lightning-unlearn {canonical[0]}"), usage
    assert all(word in usage.split() for word in canonical), usage
    # the description in the command table is the function's docstring, which jsonargparse shows
    if len(canonical) == 2:
        assert _flat(SUBCOMMANDS[canonical[0]][canonical[1]]) in _flat(printed)
    elif canonical[0] != "configs":  # configs' main (the shipped-config commands) gives its parser no description
        assert _flat(EXTRA_COMMANDS[canonical[0]][1]) in _flat(printed)
    for sub in SUBCOMMANDS.get(canonical[0], {}) if len(canonical) == 1 else ():
        assert sub in printed


def test_every_runnable_command_is_in_the_print_config_table():
    leaves = {words for words in COMMANDS if words[0] not in SUBCOMMANDS or len(words) == 2}
    assert leaves == set(MINIMAL)


@pytest.mark.parametrize("words", list(MINIMAL), ids=" ".join)
def test_print_config_with_the_minimal_arguments(words, capsys):
    code, printed = _exit([*words, *MINIMAL[words], "--print_config"], capsys)
    assert code == 0
    config = yaml.safe_load(printed)
    assert isinstance(config, dict) and config, printed
    if words == ("report",):
        assert config["run_dirs"] == ["runs/a", "runs/b"]  # one positional word per run directory
    if words == ("sweep",):
        assert config["sweep_file"] == "sweep.yaml"  # -c names the sweep file
    if words == ("evaluate",):
        assert config["eval_config"] == ["eval.yaml"]  # -c names a config merged over the run's, not this command's


def test_aliases_accept_the_old_dashed_flags(capsys):
    # the lens-baseline call of scripts/lens_trajectory.sh, as it was written for the argparse commands
    old = (
        "lens-baseline --model m --narrative n --language en --condition compact --max-new-tokens 60 --batch-size 8 "
        "--threads 1 --labeler signature --out b.jsonl"
    )
    code, printed = _exit([*old.split(), "--print_config"], capsys)
    config = yaml.safe_load(printed)
    assert code == 0 and (config["max_new_tokens"], config["batch_size"], config["threads"]) == (60, 8, 1)
    assert config["labeler"] == "signature" and config["out"] == "b.jsonl"
    code, printed = _exit(
        ["lens-summary", "runs/npo", "--baseline", "b.jsonl", "--collapse-boundary=0.3", "--print_config"], capsys
    )
    assert code == 0 and yaml.safe_load(printed) == {
        "run_dir": "runs/npo",
        "baseline": "b.jsonl",
        "collapse_boundary": 0.3,
        "validity_calibration": None,
        "min_validity_recall": 0.8,
    }
    code, printed = _exit(["lacuna-localization", "--no-control", "--batch-size", "4", "--print_config"], capsys)
    config = yaml.safe_load(printed)
    assert code == 0 and config["control"] is False and config["batch_size"] == 4
    # the new names take jsonargparse's spelling only
    code, _ = _exit(["lens", "summary", "runs/npo", "--collapse-boundary", "0.3"], capsys)
    assert code == 2


def test_underscore_flags_changes_only_option_names():
    argv = ["--max-new-tokens", "6", "--out=my-file.jsonl", "my-dir", "-c", "--", "--no-control"]
    assert underscore_flags(argv) == [
        "--max_new_tokens",
        "6",
        "--out=my-file.jsonl",
        "my-dir",
        "-c",
        "--",
        "--control",
        "false",
    ]


def test_config_file_with_short_option(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("workdir: runs/elsewhere\nsize: tiny\ninject_config: [a.yaml, b.yaml]\n")
    code, printed = _exit(["lacuna", "run", "-c", str(config), "--sequential", "true", "--print_config"], capsys)
    assert code == 0
    assert yaml.safe_load(printed) == {
        "workdir": "runs/elsewhere",
        "size": "tiny",
        "sequential": True,
        "model_path": None,
        "inject_config": ["a.yaml", "b.yaml"],
        "instruct_config": None,
        "control": False,
        "instruct": False,
        "pretrain_config": None,
    }
    report = tmp_path / "report.yaml"
    report.write_text("run_dirs: [runs/a, runs/b]\nout: elsewhere\n")
    code, printed = _exit(["report", "--config", str(report), "--print_config"], capsys)
    assert code == 0 and yaml.safe_load(printed)["run_dirs"] == ["runs/a", "runs/b"]


def test_a_missing_path_is_one_line_not_a_traceback():
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "/nonexistent"])
    message = exit_info.value.code
    assert isinstance(message, str) and "\n" not in message and "/nonexistent" in message
    assert message.startswith("lightning-unlearn report: error: ")


@pytest.mark.parametrize(
    "argv,match",
    [
        (
            ["lens", "export", "--baseline", "/no/such.jsonl", "--out", "x.csv"],
            "lightning-unlearn lens export: error: ",
        ),
        (["lens-import", "--baseline", "/no/such.jsonl", "--out", "x.jsonl"], "exactly one of --labels"),
        (["lacuna", "run", "--size", "tiny", "--inject_config+", "/no/such.yaml"], "/no/such.yaml"),
        (["mask-auc", "--pre", "p", "--inj", "i", "--unl", "u", "--masks", "m", "--control_inj", "c"], "both"),
    ],
)
def test_bad_paths_and_values_are_one_line(argv, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    message = exit_info.value.code
    assert isinstance(message, str) and "\n" not in message and match in message


def test_every_extra_command_resolves_to_a_callable():
    import importlib

    for name, (target, _) in EXTRA_COMMANDS.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_classes_by_short_name_and_no_ignored_optimizer_flags(capsys):
    # `--model NPO` resolves to lightning_unlearn.objectives.NPO; its help lists its own arguments.
    with pytest.raises(SystemExit) as done:
        main(["fit", "--model", "NPO", "--model.help", "NPO"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "lightning_unlearn.objectives.NPO" in out and "--model.beta" in out and "--model.collapse_fraction" in out
    for flag, name in (("--trainer.callbacks.help", "SCEEvaluation"), ("--data.help", "ForgetRetainDataModule")):
        with pytest.raises(SystemExit):
            main(["fit", flag, name])
        assert name in capsys.readouterr().out
    # The modules configure AdamW from model.init_args.optim: LightningCLI's --optimizer is not offered at all.
    with pytest.raises(SystemExit) as done:
        main(["fit", "--help"])
    assert "--optimizer" not in capsys.readouterr().out and done.value.code == 0
    with pytest.raises(SystemExit) as done:
        main(["fit", "--optimizer", "SGD"])
    err = capsys.readouterr().err
    assert done.value.code != 0 and "lightning-unlearn fit: error: --optimizer is not an option" in err


def test_the_cli_tells_a_users_mistake_from_a_bug_by_type():
    from lightning_unlearn.cli import _user_error
    from lightning_unlearn.errors import ConfigError, MissingPathError, UserError

    def raised(exc, cause=None):
        try:
            try:
                if cause is not None:
                    raise cause
            finally:
                raise exc
        except BaseException as err:  # noqa: BLE001
            return err

    assert _user_error(raised(ConfigError("beta=-1 must be positive"))) == "beta=-1 must be positive"
    assert isinstance(ConfigError("x"), ValueError) and isinstance(MissingPathError("x"), FileNotFoundError)
    assert _user_error(raised(ValueError("a bug: an unpacking went wrong"))) is None  # keeps its traceback
    assert _user_error(raised(KeyError("raw"))) is None
    # a library's error wrapped around ours: the innermost user error is the line
    assert _user_error(raised(RuntimeError("wrapped"), ConfigError("forget_groups [7] are not in the masks"))) == (
        "forget_groups [7] are not in the masks"
    )
    assert _user_error(raised(FileNotFoundError(2, "No such file or directory", "f.jsonl"))).endswith("'f.jsonl'")
    assert issubclass(ConfigError, UserError)
