"""The package uses Lightning through its public seams: every private Lightning name it touches is on a short list,
each with its reason, and a new one fails here."""

import ast
import importlib
import inspect
import pkgutil
import re
from collections import Counter
from pathlib import Path

import lightning_unlearn

PACKAGE = Path(lightning_unlearn.__file__).parent

# (file under lightning_unlearn/, the private name as it appears, how many times, why it is allowed)
ALLOWED = [
    ("cli.py", "_run_subcommand", 2,
     "LightningCLI has no public hook around a subcommand's run; the override adds the run lock and one-line errors"),
    ("cli.py", "_parse_ckpt_path", 1,
     "LightningCLI re-reads a checkpoint's hyperparameters here; the override keeps the configured model instead"),
    ("strategies/masked_fsdp.py", "_materialize_distributed_module", 1,
     "fills the meta-device skeletons of ranks > 0 the way ModelParallelStrategy.setup does; no public equivalent"),
    ("strategies/masked_fsdp.py", "_optimizers_to_device", 1,
     "moves optimizer state as ModelParallelStrategy.setup does; no public equivalent"),
    ("strategies/masked_fsdp.py", "_is_sharded_checkpoint", 1,
     "tells a sharded checkpoint directory from a file exactly as Lightning's own loader does"),
    ("strategies/masked_fsdp.py", "_METADATA_FILENAME", 1,
     "the name of the non-tensor file in Lightning's sharded checkpoints, which the partial-key loader reads back"),
    ("strategies/masked_fsdp.py", "_data_parallel_size", 2,
     "ModelParallelStrategy resolves data_parallel_size='auto' per node; FSDP over all ranks needs it set first"),
    ("objectives/unlearning_module.py", "_trainer", 3,
     "LightningModule has no public 'is a Trainer attached' (self.trainer raises); these hooks also run without one"),
    ("objectives/injection.py", "_trainer", 3,
     "LightningModule has no public 'is a Trainer attached' (self.trainer raises); the model also loads without one"),
    ("objectives/instruction.py", "_trainer", 1,
     "LightningModule has no public 'is a Trainer attached' (self.trainer raises); the model also loads without one"),
    ("checkpoints.py", "_trainer", 1,
     "on_load_checkpoint also runs in load_from_checkpoint, without a Trainer (self.trainer raises there)"),
    ("data/sampling.py", "fit_loop", 1,
     "the batches processed this epoch (public loop progress, no underscore; ModelCheckpoint reads the same object)"),
    ("callbacks/checkpoint_evaluator.py", "_generate_state_key", 1,
     "Callback's helper for state_key, which its docstring offers to subclasses"),
    ("callbacks/checkpoint_selection.py", "_generate_state_key", 1,
     "Callback's helper for state_key, which its docstring offers to subclasses"),
]  # fmt: skip

# Attribute accesses that reach into Lightning's objects. The names of the objects are the ones this package uses.
PRIVATE_ACCESS = re.compile(
    "|".join(
        [
            r"\btrainer\.(_(?!_)\w+)",
            r"\.(_trainer)\b",
            r"\.(_device_mesh)\b",
            r"\b(?:strategy|precision_plugin|checkpoint_io|accelerator|lightning_module|pl_module)\.(_(?!_)\w+)",
            r"\b(?:cb|callback|checkpoint_callback|ckpt|checkpoint)\.(_(?!_)\w+)",
            r"\.(_last_global_step_saved|_last_checkpoint_saved|_every_n_train_steps)\b",
            r"\b(_(?:logger|checkpoint|data|accelerator|callback|signal)_connector)\b",
            r"\b(_run_subcommand|_parse_ckpt_path)\b",
            r"\b(fit_loop)\.",
        ]
    )
)


def scan_source(text: str) -> Counter:
    """``(line number, private name) → count`` of the accesses :data:`PRIVATE_ACCESS` finds and the private names
    imported from Lightning, in one file's source."""
    found: Counter = Counter()
    for lineno, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for match in PRIVATE_ACCESS.finditer(code):
            found[lineno, next(g for g in match.groups() if g)] += 1
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lightning":
            private_module = any(part.startswith("_") for part in node.module.split("."))
            for alias in node.names:
                if private_module or alias.name.startswith("_"):
                    found[node.lineno, alias.name] += 1
    return found


def scan_class(cls: type) -> Counter:
    """``(line number, private name) → count`` for a class that derives from Lightning: every ``self._x`` it reads,
    sets or overrides (``def _x``) where ``_x`` belongs to a Lightning base class (a method or class attribute, or an
    instance attribute the base's source sets)."""
    bases = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] == "lightning"]
    found: Counter = Counter()
    if not bases:
        return found
    private = {n for b in bases for n in vars(b) if n.startswith("_") and not n.startswith("__")}
    for b in bases:
        private |= set(re.findall(r"self\.(_\w+)\s*(?::[^=\n]*)?=(?!=)", inspect.getsource(b)))
    lines, start = inspect.getsourcelines(cls)
    for offset, line in enumerate(lines):
        code = line.split("#", 1)[0]
        for name in re.findall(r"self\.(_\w+)", code) + re.findall(r"^\s+def (_\w+)\(", code):
            if name in private and not name.startswith("__"):
                found[start + offset, name] += 1
    return found


def package_occurrences() -> Counter:
    """``(file under lightning_unlearn/, private name) → count`` over the whole package."""
    per_line: dict[str, Counter] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        per_line[path.relative_to(PACKAGE).as_posix()] = scan_source(path.read_text())
    for info in pkgutil.walk_packages(lightning_unlearn.__path__, "lightning_unlearn."):
        module = importlib.import_module(info.name)
        rel = Path(module.__file__).relative_to(PACKAGE).as_posix()
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                # a line both scans see counts once
                per_line[rel] |= scan_class(cls)
    found: Counter = Counter()
    for rel, lines in per_line.items():
        for (_, name), count in lines.items():
            found[rel, name] += count
    return found


def test_no_private_lightning_access_outside_the_allow_list():
    found = package_occurrences()
    allowed = {(rel, name): count for rel, name, count, _ in ALLOWED}
    unexpected = {key: n for key, n in found.items() if n > allowed.get(key, 0)}
    assert not unexpected, (
        "private Lightning access {(file, name): count}: use a public seam (a callback hook, trainer.strategy, a "
        f"documented LightningModule hook), or add it to ALLOWED with its reason: {unexpected}"
    )


def test_every_allowed_private_access_still_exists():
    found = package_occurrences()
    stale = [(rel, name, count, found[rel, name]) for rel, name, count, _ in ALLOWED if found[rel, name] < count]
    assert not stale, f"ALLOWED overstates these (file, name, allowed, found); lower or remove them: {stale}"


def test_the_scans_see_a_new_private_access():
    from lightning.pytorch.callbacks import ModelCheckpoint

    source = (
        "from lightning.fabric.utilities.load import _METADATA_FILENAME\n"
        "def stop(trainer, cb):\n"
        "    cb._last_global_step_saved = trainer.global_step  # the old stop rule\n"
        "    return trainer._results, trainer.fit_loop.epoch_loop\n"
    )
    assert scan_source(source) == Counter(
        {(1, "_METADATA_FILENAME"): 1, (3, "_last_global_step_saved"): 1, (4, "_results"): 1, (4, "fit_loop"): 1}
    )

    class Probe(ModelCheckpoint):
        def _should_skip_saving_checkpoint(self, trainer):
            return self._last_global_step_saved == trainer.global_step and self._own

    assert sorted(name for _, name in scan_class(Probe)) == [
        "_last_global_step_saved",
        "_should_skip_saving_checkpoint",
    ]
