"""``lightning-unlearn sweep -c sweep.yaml``: many trajectories, one LightningCLI ``fit`` per cell, on an executor.

A sweep file names the base configs, the cells and an executor::

    base: [lens/npo.yaml, my_run.yaml]        # -c files of every cell (shipped names allowed), in order
    root: runs/sweeps/npo                      # one directory per cell under it
    overrides: {trainer.max_steps: 60}         # dotted overrides of every cell
    grid:                                      # every combination of these dotted overrides …
      model.init_args.optim.lr: [1.0e-4, 2.0e-4]
      seed_everything: [0, 1]
    cells:                                     # … crossed with each of these (default: one empty cell)
      - {model.class_path: NPO}
      - {model.class_path: SimNPO, resources: {nodes: 2, tasks_per_node: 2}}
    evaluate: {configs: [eval.yaml]}          # what `sweep --evaluate true` runs on every finished cell
                                               # (steps_per_job: N: one job per N saved steps of a cell;
                                               # resources: {gpus_per_node: 1, timeout_min: 30}: each job's,
                                               # one task on one node, whatever the cells trained on)
    executor:
      kind: local                              # local | submitit-local | slurm
      parallel: 2                              # cells at a time (slurm: the array's parallelism)
      threads: 1                               # torch threads per cell process (OMP_NUM_THREADS)
      timeout_min: 60                          # submitit / slurm
      slurm: {partition: gpu, account: lab}    # any further submitit slurm_* parameter, without the prefix

A top-level key starting with ``x-`` is not read: a place for YAML anchors that cells share (``x-callbacks: [&ckpt
{...}]``, then ``trainer.callbacks: [*ckpt, …]`` in a cell). A value may contain ``{cell_dir}`` (e.g.
``trainer.logger.init_args.save_dir: "{cell_dir}"``). Besides dotted overrides, a grid key or a cell may hold
``configs`` (further ``-c`` files: ``-c`` order is base, the grid's, the cell's), and a cell ``label`` and
``panel`` (what ``report`` draws it as: the heatmap row and the panel, e.g. a method and a narrative × language;
by default the readable id of the grid's and of the cell's own values).
Each cell runs
``fit -c base… --key value… --run_hparams {…} --trainer.default_root_dir <cell_dir>`` in
``<root>/<readable id>-<digest>``, where the digest is of its overrides and the id is made of their values
(``--run_hparams``: the cell's name, label, panel and overrides, recorded with its checkpoint selection in
TensorBoard's HParams view). Its ``cell.json`` records the recipe (the base
configs' text and the overrides); a directory built from another recipe is refused, as the Lacuna chain refuses a
stage built from other configs. ``cell_done.json`` marks a finished cell, which a re-run skips; an interrupted cell
resumes from its newest checkpoint (``--ckpt_path last``), so its evaluation rows appear once.

Executors run cells through an existing engine: ``local`` is a pool of ``parallel`` subprocesses on this machine;
``submitit-local`` and ``slurm`` go through submitit (``LocalExecutor``, ``SlurmExecutor``): an array job of the
cells, each with its resources; a cell with ``nodes > 1`` is its own job whose tasks become Lightning's ranks
(``SLURMEnvironment``), and a preempted or timed-out job is requeued and resumes from its last checkpoint
(``submitit.helpers.Checkpointable``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from lightning_unlearn.atomic import write_text_atomically
from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.workflows import recipes
from lightning_unlearn.workflows.command import dispatch
from lightning_unlearn.workflows.fit_command import FitCommand

log = logging.getLogger("lightning_unlearn")

CELL_FILE = "cell.json"
DONE_FILE = "cell_done.json"
EXECUTORS = ("local", "submitit-local", "slurm")
_RESOURCE_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min")


@dataclass
class Cell:
    """One trajectory of a sweep: its overrides, extra ``-c`` files, directory, resources, and report labels."""

    overrides: dict[str, Any]
    directory: Path
    resources: dict[str, Any] = field(default_factory=dict)
    configs: list[str] = field(default_factory=list)
    label: str = ""
    panel: str = ""

    @property
    def name(self) -> str:
        """The cell's name: its directory's."""
        return self.directory.name


@dataclass
class Sweep:
    """A parsed sweep file."""

    base: list[str]
    root: Path
    cells: list[Cell]
    executor: dict[str, Any]
    source: Path
    evaluate: dict[str, Any] = field(default_factory=dict)


def _digest(overrides: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(overrides, sort_keys=True).encode(), digest_size=4).hexdigest()


def _readable(overrides: dict[str, Any]) -> str:
    parts = []
    for key, value in overrides.items():
        if key == "configs":
            text = "-".join(Path(str(c)).name.removesuffix(".yaml") for c in value)
        elif isinstance(value, str) and "." in value and "/" not in value:
            text = value.rsplit(".", 1)[-1]  # a class path: its class name
        else:
            text = str(value)
        parts.append(re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_"))
    return "-".join(p for p in parts if p)[:48] or "cell"


def _config_list(value: Any, where: str) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ConfigError(f"{where}: `configs` must be a config file or a list of them.")
    return list(values)


def _cells(path: Path, root: Path, common: dict, grid: dict, listed: list[dict]) -> list[Cell]:
    """Every cell of a sweep file: each listed cell crossed with every combination of the grid's values."""
    cells, seen = [], {}
    combos = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    for listed_cell, combo in itertools.product(listed, combos):
        listed_cell, combo = dict(listed_cell), dict(combo)
        resources = dict(listed_cell.pop("resources", None) or {})
        bad = set(resources) - set(_RESOURCE_KEYS)
        if bad:
            raise ConfigError(f"sweep file {path}: unknown resources {sorted(bad)}; use {', '.join(_RESOURCE_KEYS)}.")
        label, panel = listed_cell.pop("label", None), listed_cell.pop("panel", None)
        configs = _config_list(combo.get("configs", []), f"sweep file {path}: grid")
        configs += _config_list(listed_cell.get("configs", []), f"sweep file {path}: cells")
        own = {k: v for k, v in listed_cell.items() if k != "configs"}
        grid_values = {k: v for k, v in combo.items() if k != "configs"}
        overrides = {**common, **own, **grid_values}
        identity = {**({"configs": configs} if configs else {}), **overrides}
        # what tells this cell from the others: the grid's values, then the cell's panel (or its own values)
        parts = [
            _readable(combo) if combo else "",
            str(panel) if panel else (_readable(listed_cell) if listed_cell else ""),
        ]
        readable = re.sub(r"[^A-Za-z0-9.+-]+", "_", "-".join(p for p in parts if p))[:64] or "cell"
        name = f"{readable}-{_digest(identity)}"
        if name in seen:
            raise ConfigError(f"sweep file {path}: two cells have the same overrides {identity}.")
        seen[name] = True
        cell = Cell(overrides, root / name, resources, configs)
        cell.label = str(label) if label is not None else (_readable(combo) if combo else name)
        cell.panel = str(panel) if panel is not None else (_readable(listed_cell) if listed_cell else "")
        cells.append(cell)
    return cells


def _evaluate_options(spec: dict, path: Path) -> dict[str, Any]:
    """The sweep file's checked ``evaluate`` options."""
    evaluate = dict(spec.get("evaluate") or {})
    unknown = set(evaluate) - {"configs", "adapters_per_pass", "steps_per_job", "resources"}
    if unknown:
        raise ConfigError(
            f"sweep file {path}: unknown evaluate keys {sorted(unknown)}; use configs, adapters_per_pass, "
            "steps_per_job, resources."
        )
    allowed = {"gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min"}
    if set(evaluate.get("resources") or {}) - allowed:
        raise ConfigError(
            f"sweep file {path}: evaluate.resources may hold {sorted(allowed)}; an evaluation job is one task on "
            f"one node, got {sorted(evaluate['resources'])}."
        )
    per_job = evaluate.get("steps_per_job")
    if per_job is not None and (isinstance(per_job, bool) or not isinstance(per_job, int) or per_job < 1):
        raise ConfigError(f"sweep file {path}: evaluate.steps_per_job={per_job!r} must be a whole number ≥ 1.")
    if "configs" in evaluate:
        evaluate["configs"] = _config_list(evaluate["configs"], f"sweep file {path}: evaluate")
    return evaluate


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Parse and check a sweep file; every problem is one ``ValueError`` naming the key and the fix."""
    from lightning_unlearn.configs.yaml_files import read_yaml

    path = Path(path).expanduser()
    if not path.is_file():
        from lightning_unlearn.configs import config_root, shipped_config

        if not (config_root() / str(path).removeprefix("configs/")).is_file():
            raise MissingPathError(
                f"sweep file {path} not found (nor a shipped one: `lightning-unlearn configs list`)."
            )
        path = shipped_config(str(path))  # a shipped sweep file by name; a local file always wins
    spec = read_yaml(path) or {}
    if not isinstance(spec, dict):
        raise ConfigError(f"sweep file {path}: the file must be a mapping of base, root, overrides, grid, cells, "
                         f"executor (it is a {type(spec).__name__}).")  # fmt: skip
    keys = ("base", "root", "overrides", "grid", "cells", "executor", "evaluate")
    unknown = {k for k in set(spec) - set(keys) if not str(k).startswith("x-")}  # x-…: YAML anchors, not read
    if unknown:
        raise ConfigError(f"sweep file {path}: unknown keys {sorted(unknown)}; use {', '.join(keys)} (or x-… for "
                         "YAML anchors).")  # fmt: skip
    base = _config_list(spec.get("base") or [], f"sweep file {path}: base")
    common = dict(spec.get("overrides") or {})
    if "root" not in spec:
        raise ConfigError(f"sweep file {path}: `root` (the directory of the cells) is missing.")
    root = Path(str(spec["root"])).expanduser()
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"sweep file {path}: `grid` must map each dotted key to its list of values "
                         "(`grid: {model.init_args.optim.lr: [1.0e-4, 2.0e-4]}`), not a list.")  # fmt: skip
    if not isinstance(spec.get("overrides") or {}, dict):
        raise ConfigError(f"sweep file {path}: `overrides` must map dotted keys to values, not a list.")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep file {path}: grid.{key} must be a non-empty list of values.")
    listed = spec.get("cells") or [{}]
    if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
        raise ConfigError(f"sweep file {path}: `cells` must be a list of mappings of dotted overrides.")
    executor = {"kind": "local", "parallel": 1, "threads": None, "timeout_min": 60, "slurm": {}}
    executor.update(spec.get("executor") or {})
    if executor["kind"] not in EXECUTORS:
        raise ConfigError(f"sweep file {path}: executor.kind={executor['kind']!r} is not one of {EXECUTORS}.")
    for name in ("parallel", "threads", "timeout_min"):
        value = executor[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"sweep file {path}: executor.{name}={value!r} must be a positive whole number.")
    cells = _cells(path, root, common, grid, listed)
    if executor["kind"] == "local" and any(int(c.resources.get("nodes", 1)) > 1 for c in cells):
        raise ConfigError(
            f"sweep file {path}: a cell asks for several nodes, which executor.kind 'local' cannot give; use "
            "executor.kind 'slurm', or drop `resources.nodes`."
        )
    if not base and not any(c.configs for c in cells):
        raise ConfigError(f"sweep file {path}: name the configs of the cells in `base` (or in grid/cells `configs`).")
    evaluate = _evaluate_options(spec, path)
    return Sweep(base, root, cells, executor, path, evaluate)


def _resolve_configs(sweep: Sweep, cell: Cell) -> list[Path]:
    """The cell's ``-c`` files (base, grid, cell) as files: a local path (as given, or relative to the sweep file's
    folder) wins, else a shipped config of that name."""
    from lightning_unlearn.configs import shipped_config

    out = []
    for name in [*sweep.base, *cell.configs]:
        name = name.replace("{cell_dir}", str(cell.directory))
        candidates = [Path(name).expanduser(), sweep.source.parent / name]
        local = next((c for c in candidates if c.is_file()), None)
        try:
            out.append(local.resolve() if local is not None else shipped_config(name))
        except FileNotFoundError:
            raise MissingPathError(
                f"sweep cell {cell.name}: config {name!r} is neither a file (here or beside {sweep.source}) nor a "
                "shipped config."
            ) from None
    return out


def _value(value: Any, cell: Cell) -> str:
    if isinstance(value, str):
        return value.replace("{cell_dir}", str(cell.directory))
    return json.dumps(value)


def cell_hparams(cell: Cell) -> dict[str, Any]:
    """What tells a cell from the others in TensorBoard's HParams view (``fit --run_hparams``): ``sweep.cell``,
    ``sweep.label``, ``sweep.panel``, its overrides as the sweep file writes them and its own ``configs``."""
    out: dict[str, Any] = {"sweep.cell": cell.name, "sweep.label": cell.label, "sweep.panel": cell.panel}
    out.update(cell.overrides)
    if cell.configs:
        out["configs"] = list(cell.configs)
    return out


def cell_command(sweep: Sweep, cell: Cell, nodes: int = 1, devices: int | None = None) -> FitCommand:
    """The ``fit`` of one cell: its configs, overrides and HParams, in its directory (resuming when it holds a
    checkpoint)."""
    overrides = []
    for key, value in cell.overrides.items():
        overrides += [f"--{key}", _value(value, cell)]
    overrides += ["--run_hparams", json.dumps(cell_hparams(cell))]
    if nodes > 1:
        overrides += ["--trainer.num_nodes", str(nodes)]
    if devices is not None:
        overrides += ["--trainer.devices", str(devices)]
    return FitCommand(_resolve_configs(sweep, cell), cell.directory, overrides)


def _recipe(sweep: Sweep, cell: Cell) -> dict:
    return {
        "configs": [p.read_text(encoding="utf-8") for p in _resolve_configs(sweep, cell)],
        "overrides": {k: _value(v, cell) for k, v in cell.overrides.items()},
        "label": cell.label,
        "panel": cell.panel,
    }


_TOP_LEVEL = ("model", "data", "trainer", "seed_everything", "ckpt_path", "allow_data_change", "configs")


def check_override_keys(sweep: Sweep, path: str | os.PathLike) -> None:
    """Every dotted override of every cell names an option of the configured classes (the model's and data's
    ``init_args``, the Trainer's arguments), checked before any cell is launched: a misspelt key would otherwise fail
    in every cell after its directory was made. Keys under a class that does not import are left to the run."""
    import difflib

    from lightning_unlearn.configs import option_classes
    from lightning_unlearn.configs.yaml_files import read_yaml

    for cell in sweep.cells:
        merged: dict = {}
        try:
            for file in _resolve_configs(sweep, cell):
                merged = _merge(merged, read_yaml(file) or {})
        except FileNotFoundError:
            continue  # a config the steps before the sweep write: the run checks it
        for key in cell.overrides:
            parts = key.split(".")
            if parts[0] not in _TOP_LEVEL:
                raise ConfigError(f"sweep file {path}: override {key!r}: {parts[0]!r} is not one of {_TOP_LEVEL}.")
            if parts[0] in ("model", "data") and len(parts) > 2 and parts[1] == "init_args":
                class_path = cell.overrides.get(f"{parts[0]}.class_path") or (merged.get(parts[0]) or {}).get(
                    "class_path"
                )
                start = 2
            elif parts[0] == "trainer" and len(parts) > 1:
                class_path, start = "lightning.pytorch.Trainer", 1
            else:
                continue
            if not isinstance(class_path, str):
                continue
            # every level: model.init_args.optim.lr checks optim against the objective and lr against OptimizerConfig
            for depth, (owner, valid) in enumerate(option_classes(class_path, parts[start:])):
                option = parts[start + depth]
                if option not in valid:
                    close = difflib.get_close_matches(option, valid, n=1)
                    hint = f"; did you mean {'.'.join([*parts[: start + depth], close[0]])!r}?" if close else ""
                    raise ConfigError(
                        f"sweep file {path}: override {key!r}: {option!r} is not an option of {owner}{hint}"
                    )


def _merge(base: dict, top: dict) -> dict:
    """``top`` over ``base``, mappings merged key by key (as jsonargparse merges ``-c`` files)."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _check_root(root: Path) -> None:
    """The sweep root can be made: no part of it is an existing file."""
    for part in [root, *root.parents]:
        if part.exists() and not part.is_dir():
            raise ConfigError(f"sweep root {str(root)!r}: {str(part)!r} is a file; give `root` a directory path.")


def check_cell(sweep: Sweep, cell: Cell) -> str:
    """``"done"``, ``"resume"`` or ``"new"``; records the recipe of a new cell. A directory built from another
    recipe raises ``ValueError``."""
    recipe = _recipe(sweep, cell)
    fix = f"Delete {str(cell.directory)!r} to rebuild it, or give the sweep another root."
    found = recipes.check_recipe(cell.directory / CELL_FILE, recipe, f"sweep cell {str(cell.directory)!r}",
                                 "this sweep's", fix)  # fmt: skip
    if found != recipe:  # a new cell, or only the report labels changed: not a different recipe
        recipes.record_recipe(cell.directory / CELL_FILE, recipe)
    if found is None:
        return "new"
    return "done" if (cell.directory / DONE_FILE).exists() else "resume"


def _cell_progress(name: str, line: str) -> None:
    log.info("sweep: cell %s: %s", name, line)


def run_cell(sweep: Sweep, cell: Cell, threads: int | None = None, nodes: int = 1, devices: int | None = None) -> int:
    """Run (or resume) one cell to the end in a subprocess; its output goes to ``<cell_dir>/fit.log`` and its progress
    lines (:class:`~lightning_unlearn.callbacks.LogProgress`) to this process's log too. Writes
    ``cell_done.json`` (rank 0 of a multi-node job only) when ``fit`` succeeded. Returns the exit code."""
    from lightning_unlearn.workflows import processes

    if (cell.directory / DONE_FILE).exists():
        return 0
    cmd = cell_command(sweep, cell, nodes, devices).argv()
    start = time.perf_counter()
    log_file = cell.directory / "fit.log"
    log.info("sweep: cell %s started; its whole output is in %s", cell.name, log_file)
    offset = log_file.stat().st_size if log_file.exists() else 0  # a resumed cell adds to its log
    proc = processes.spawn_stage(cmd, threads, log_file, append=True)
    follower = processes.follow_progress(log_file, proc, partial(_cell_progress, cell.name), start=offset)
    code = proc.wait()
    follower.join()
    log.info("sweep: cell %s %s after %.0f s", cell.name, "finished" if code == 0 else f"failed (exit {code})",
             time.perf_counter() - start)  # fmt: skip
    if code == 0 and int(os.environ.get("SLURM_PROCID", "0")) == 0:
        done = {"seconds": round(time.perf_counter() - start, 1), "command": cmd}
        write_text_atomically(cell.directory / DONE_FILE, json.dumps(done, indent=1))
    return code


def run_directory(cell: Cell) -> Path:
    """The run directory of a finished cell: where LightningCLI saved its ``config.yaml`` (the logger's version)."""
    found = sorted(cell.directory.rglob("config.yaml"), key=lambda p: p.stat().st_mtime_ns)
    if not found:
        raise MissingPathError(f"sweep cell {cell.name}: no config.yaml under {cell.directory}; has it run?")
    return found[-1].parent


def evaluate_cell(sweep: Sweep, cell: Cell, threads: int | None = None, steps: list[int] | None = None) -> int:
    """``lightning-unlearn evaluate`` of one finished cell's run (the sweep's ``evaluate`` options; ``steps``: only
    those saved steps), in a subprocess whose output goes to ``<cell_dir>/evaluate.log`` (with ``steps``,
    ``evaluate-steps=A-B.log``); the exit code."""
    from lightning_unlearn.workflows import processes

    options = sweep.evaluate
    cmd = [sys.executable, "-m", "lightning_unlearn.cli", "evaluate", str(run_directory(cell))]
    for config in options.get("configs") or []:
        local = next((c for c in (Path(config).expanduser(), sweep.source.parent / config) if c.is_file()), None)
        cmd += ["-c", str(local.resolve() if local is not None else config)]
    if int(options.get("adapters_per_pass", 1)) > 1:
        cmd += ["--adapters_per_pass", str(int(options["adapters_per_pass"]))]
    name = "evaluate.log"
    if steps is not None:
        cmd += ["--steps", json.dumps(list(steps))]
        name = f"evaluate-steps={steps[0]}-{steps[-1]}.log"
    return processes.run_stage(cmd, threads, cell.directory / name, append=True)


def evaluation_jobs(sweep: Sweep, cells: list[Cell]) -> list[tuple[Cell, list[int] | None]]:
    """The evaluation jobs of finished cells: one per cell, or with ``evaluate.steps_per_job: N`` one per N saved
    steps of each cell (consecutive, ascending), so a long trajectory's checkpoints are evaluated side by side."""
    per_job = sweep.evaluate.get("steps_per_job")
    if per_job is None:
        return [(cell, None) for cell in cells]
    from lightning_unlearn.workflows.evaluate import saved_checkpoints

    jobs = []
    for cell in cells:
        steps = [c.step for c in saved_checkpoints(run_directory(cell))]
        jobs += [(cell, steps[i : i + per_job]) for i in range(0, len(steps), per_job)]
    return jobs


class CellJob:
    """A submitit job running one cell (``action`` ``fit`` or ``evaluate``); requeued on preemption or timeout, it
    resumes: a fit from its last checkpoint, an evaluation from the rows already written."""

    def __init__(
        self,
        sweep: Sweep,
        cell: Cell,
        threads: int | None,
        nodes: int,
        devices: int | None,
        action: str = "fit",
        steps: list[int] | None = None,
    ) -> None:
        self.sweep, self.cell, self.threads, self.nodes, self.devices = sweep, cell, threads, nodes, devices
        self.action, self.steps = action, steps

    def __call__(self) -> int:
        if self.action == "evaluate":
            code = evaluate_cell(self.sweep, self.cell, self.threads, self.steps)
        else:
            code = run_cell(self.sweep, self.cell, self.threads, self.nodes, self.devices)
        if code != 0:
            log_file = self.cell.directory / ("evaluate.log" if self.action == "evaluate" else "fit.log")
            raise RuntimeError(f"cell {self.cell.name} failed with exit code {code}; see {log_file}")
        return code

    def checkpoint(self, *args, **kwargs):
        """submitit calls this before requeueing: run the same cell again (it resumes from its last checkpoint)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self)


def submitit_parameters(
    executor: dict[str, Any], cell: Cell | None = None, resources: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``update_parameters`` keywords of submitit's ``AutoExecutor`` for the sweep's executor and (optionally)
    one cell's resources, or ``resources`` given directly (an evaluation job's)."""
    resources = dict(resources if resources is not None else cell.resources if cell is not None else {})
    params: dict[str, Any] = {"timeout_min": int(resources.pop("timeout_min", executor.get("timeout_min", 60)))}
    params["nodes"] = int(resources.pop("nodes", 1))
    params["tasks_per_node"] = int(resources.pop("tasks_per_node", 1))
    for key in ("gpus_per_node", "cpus_per_task", "mem_gb"):
        if key in resources:
            params[key] = resources.pop(key)
    if executor["kind"] == "slurm":
        params["slurm_array_parallelism"] = int(executor["parallel"])
        params.update({f"slurm_{k}": v for k, v in (executor.get("slurm") or {}).items()})
    return params


def evaluation_parameters(sweep: Sweep) -> dict[str, Any]:
    """The submitit parameters of every evaluation job (``--evaluate``): one task on one node, with the sweep's
    ``evaluate.resources``; what ``--dry_run`` shows is what is submitted."""
    return submitit_parameters(sweep.executor, resources=sweep.evaluate.get("resources") or {})


def sbatch_script(folder: str | os.PathLike, params: dict[str, Any], array_size: int | None = None) -> str:
    """The ``sbatch`` script submitit's ``SlurmExecutor`` submits for these ``AutoExecutor`` parameters
    (``array_size``: an array job of that many), built without a cluster (for ``--dry_run`` and tests)."""
    _submitit()
    from submitit.slurm import slurm

    equivalent = slurm.SlurmExecutor._equivalence_dict()
    converted = {}
    for key, value in params.items():
        key = key.removeprefix("slurm_") if key.startswith("slurm_") else equivalent.get(key, key)
        converted[key] = value
    if "mem" in converted:
        converted["mem"] = slurm._convert_mem(converted["mem"])
    unknown = set(converted) - slurm.SlurmExecutor._valid_parameters()
    if unknown:
        raise ConfigError(f"sweep: unknown slurm parameters {sorted(unknown)} in executor.slurm or a cell's resources.")
    return slurm._make_sbatch_string(
        command="python -m submitit.core._submit", folder=str(folder), map_count=array_size, **converted
    )


def _job_name(cell: Cell, steps: list[int] | None) -> str:
    return cell.name if steps is None else f"{cell.name}@steps={steps[0]}-{steps[-1]}"


def _run_local(sweep: Sweep, cells: list[Cell], action: str = "fit", steps: list | None = None) -> dict[str, int]:
    """Run ``cells`` (with ``steps``, the saved steps of each evaluation job) ``parallel`` at a time; exit codes."""
    threads = sweep.executor.get("threads")
    steps = steps or [None] * len(cells)

    def work(job):
        cell, chosen = job
        return evaluate_cell(sweep, cell, threads, chosen) if action == "evaluate" else run_cell(sweep, cell, threads)

    jobs = list(zip(cells, steps, strict=True))
    with ThreadPoolExecutor(max_workers=int(sweep.executor["parallel"])) as pool:
        codes = dict(zip((_job_name(*j) for j in jobs), pool.map(work, jobs), strict=True))
    return codes


def _submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError(
            "sweep: executor.kind 'submitit-local' and 'slurm' run through submitit, which is not installed; "
            "pip install 'lightning-unlearn[slurm]' (or use executor.kind: local)."
        ) from None
    return submitit


def _run_submitit(sweep: Sweep, cells: list[Cell], action: str = "fit", steps: list | None = None) -> dict[str, int]:
    """``cells`` (with ``steps``, the saved steps of each evaluation job) as submitit jobs; exit codes."""
    submitit = _submitit()

    kind = sweep.executor["kind"]
    folder = sweep.root / "submitit"
    threads = sweep.executor.get("threads")
    pairs = list(zip(cells, steps or [None] * len(cells), strict=True))
    jobs = []
    if action == "evaluate":  # one array of single-task jobs, with the sweep's `evaluate.resources`, not a cell's
        single = pairs
    else:
        single = [p for p in pairs if int(p[0].resources.get("nodes", 1)) == 1 and not p[0].resources]
    groups = [single] if single else []
    groups += [[p] for p in pairs if p not in single]  # a cell with its own resources is its own job
    for group in groups:
        first = group[0][0]
        executor = submitit.AutoExecutor(folder=str(folder), cluster="local" if kind == "submitit-local" else "slurm")
        if action == "evaluate":
            params = evaluation_parameters(sweep)
        else:
            params = submitit_parameters(sweep.executor, first if first.resources else None)
        if kind == "submitit-local":
            params = {k: v for k, v in params.items() if k in ("timeout_min", "nodes", "tasks_per_node")}
            params["nodes"] = 1
        executor.update_parameters(name=f"sweep-{sweep.root.name}", **params)
        nodes = params.get("nodes", 1)
        devices = params.get("tasks_per_node") if nodes > 1 else None
        calls = [CellJob(sweep, c, threads, nodes, devices, action, chosen) for c, chosen in group]
        if kind == "submitit-local":
            # LocalExecutor runs every job of an array at once; keep `parallel` of them in flight.
            for start in range(0, len(calls), int(sweep.executor["parallel"])):
                batch = [executor.submit(call) for call in calls[start : start + int(sweep.executor["parallel"])]]
                jobs += list(zip(group[start : start + len(batch)], batch, strict=True))
                for job in batch:
                    job.exception()  # wait
        else:
            with executor.batch():
                submitted = [executor.submit(call) for call in calls]
            jobs += list(zip(group, submitted, strict=True))
    codes = {}
    for (cell, chosen), job in jobs:
        error = job.exception()
        codes[_job_name(cell, chosen)] = 0 if error is None else 1
        if error is not None:
            log.error("sweep: job %s failed: %s", _job_name(cell, chosen), error)
    return codes


def sweep_command(sweep_file: Path, *, dry_run: bool = False, evaluate: bool = False) -> dict:
    """Run every cell of a sweep file on its executor; finished cells are skipped, interrupted ones resumed.

    Args:
        sweep_file: the sweep file (``base``, ``root``, ``grid``, ``cells``, ``executor``; see the module docstring).
        dry_run: print the cells (directory, overrides, state, command) and run nothing; with ``evaluate``, the
            evaluation jobs (cell, steps) and, on slurm, their array's sbatch script.
        evaluate: instead of training, run ``lightning-unlearn evaluate`` on every finished cell, one job per cell
            (``evaluate.steps_per_job: N``: per N saved steps) on the same executor (the sweep file's
            ``evaluate: {configs: [...], adapters_per_pass: K, steps_per_job: N}``): rows still missing are added,
            e.g. a metric family added after training.

    Returns:
        ``{"root", "cells": [{"name", "state", "overrides", "exit_code"}]}``.
    """
    sweep = load_sweep(sweep_file)
    _check_root(sweep.root)
    check_override_keys(sweep, sweep_file)
    if evaluate:
        finished = [c for c in sweep.cells if (c.directory / DONE_FILE).exists()]
        waiting = [c.name for c in sweep.cells if c not in finished]
        if waiting:
            log.warning("sweep: %d cell(s) not finished, not evaluated: %s", len(waiting), waiting)
        run = _run_local if sweep.executor["kind"] == "local" else _run_submitit
        jobs = evaluation_jobs(sweep, finished)
        if dry_run:
            out = {"root": str(sweep.root), "jobs": [{"cell": c.name, "steps": s} for c, s in jobs],
                   "not_finished": waiting}  # fmt: skip
            if sweep.executor["kind"] == "slurm" and jobs:
                params = evaluation_parameters(sweep)
                out["sbatch"] = {"evaluate": sbatch_script(sweep.root / "submitit", params, len(jobs))}
            return out
        codes = run(sweep, [c for c, _ in jobs], "evaluate", [s for _, s in jobs])
        if sweep.evaluate.get("steps_per_job") is not None and not any(codes.values()):
            # Jobs of one cell select side by side, each from the rows it saw: one more short `evaluate` per cell
            # (its last step, every row present, nothing computed) selects from all of them.
            last = {c.name: (c, s[-1]) for c, s in jobs if s}  # the chunks ascend: a cell's last one wins
            cells = [c for c, _ in last.values()]
            codes.update(run(sweep, cells, "evaluate", [[step] for _, step in last.values()]))
        failed = [name for name, code in codes.items() if code]
        if failed:
            raise RuntimeError(f"sweep: {len(failed)} evaluation job(s) failed: {failed}; see their evaluate*.log")
        return {"root": str(sweep.root), "evaluated": sorted({c.name for c, _ in jobs}), "jobs": len(jobs),
                "not_finished": waiting}  # fmt: skip
    rows = []
    todo = []
    for cell in sweep.cells:
        state = "done" if (cell.directory / DONE_FILE).exists() else None
        if not dry_run:
            state = check_cell(sweep, cell)
        elif state is None:
            state = "resume" if (cell.directory / CELL_FILE).exists() else "new"
        rows.append({"name": cell.name, "state": state, "overrides": cell.overrides})
        rows[-1].update(label=cell.label, panel=cell.panel)
        if dry_run:
            try:
                rows[-1]["command"] = " ".join(cell_command(sweep, cell).argv())
            except FileNotFoundError as err:  # a config the steps before the sweep write
                rows[-1]["command"] = f"(not yet runnable: {err})"
        elif state != "done":
            todo.append(cell)
    if dry_run:
        out = {"root": str(sweep.root), "executor": sweep.executor["kind"], "cells": rows}
        if sweep.executor["kind"] == "slurm":
            folder = sweep.root / "submitit"
            plain = [c for c in sweep.cells if not c.resources]
            out["sbatch"] = {c.name: sbatch_script(folder, submitit_parameters(sweep.executor, c)) for c in sweep.cells
                             if c.resources}  # fmt: skip
            if plain:
                out["sbatch"]["array"] = sbatch_script(folder, submitit_parameters(sweep.executor), len(plain))
        return out
    log.info("sweep: %d cells, %d to run on %s", len(rows), len(todo), sweep.executor["kind"])
    codes = _run_local(sweep, todo) if sweep.executor["kind"] == "local" else _run_submitit(sweep, todo)
    for row in rows:
        row["exit_code"] = codes.get(row["name"], 0)
    failed = [r["name"] for r in rows if r["exit_code"]]
    if failed:
        raise RuntimeError(f"sweep: {len(failed)} cell(s) failed: {failed}; see each cell's fit.log")
    return {"root": str(sweep.root), "cells": rows}


def main(argv: list[str] | None = None) -> None:
    """``lightning-unlearn sweep -c SWEEP.yaml [--dry_run true]``: see :func:`sweep_command`.

    ``-c FILE`` names the sweep file (the same as giving it as the first word), not a config of this command.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    if len(words) >= 2 and words[0] in ("-c", "--config"):
        words = [words[1], *words[2:]]
    dispatch(sweep_command, words, "lightning-unlearn sweep")
