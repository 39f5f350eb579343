"""Build or load causal LMs and tokenizers from local paths only, and attach peft adapters.

Nothing here downloads: every loader passes ``local_files_only=True`` and a missing path is a
``FileNotFoundError`` that names the path. Tiny Llama-architecture models are built from a config so
tests and the built-in default run on a CPU in seconds.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn

from lightning_unlearn.errors import ConfigError, MissingPathError
from lightning_unlearn.parameter_names import canonical_name

SPECIAL_TOKENS = {"bos": "<|bos|>", "eos": "<|eos|>", "pad": "<|pad|>", "unk": "<|unk|>"}


@dataclass
class AdapterConfig:
    """Which parameters an objective trains.

    Args:
        kind: ``"full"`` (full fine-tuning), ``"lora"`` or ``"adalora"`` (peft).
        r: LoRA rank (AdaLoRA: the initial rank).
        alpha: LoRA scaling numerator (``lora_alpha``).
        dropout: LoRA dropout.
        target_modules: module-name suffixes that receive adapters; ``None`` means every linear projection
            of the transformer blocks (``q/k/v/o_proj``, ``gate/up/down_proj``).
        layers: only these block indices get adapters (negative counts from the end, so ``[-2, -1]`` is the
            last two blocks, as in Lacuna's instruction tuning); ``None`` means all blocks.
        total_step: AdaLoRA's rank-budget schedule needs the total number of optimizer steps.
        path: start from a saved peft adapter directory (e.g. a checkpoint's ``adapter-step=N/``) instead of a fresh
            adapter: ``validate`` then evaluates that adapter, ``fit`` continues training it. Its
            ``adapter_config.json`` decides rank and targets; ``kind`` must match its type.
    """

    kind: str = "full"
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] | None = None
    layers: list[int] | None = None
    total_step: int = 1000
    path: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("full", "lora", "adalora"):
            raise ConfigError(f"adapter.kind={self.kind!r} is not one of 'full', 'lora', 'adalora'.")
        if self.r <= 0:
            raise ConfigError(f"adapter.r must be positive, got {self.r}.")
        if self.path is not None and self.kind == "full":
            raise ConfigError(
                "adapter.path names a peft adapter, but adapter.kind='full'; set kind to 'lora' or 'adalora'."
            )


@dataclass
class TinyLlamaConfig:
    """A Llama-architecture model small enough for a CPU.

    Args:
        hidden_size: model width.
        num_layers: transformer blocks.
        num_heads: attention heads (``hidden_size`` must divide by it).
        intermediate_size: MLP width; ``None`` means Llama's 8/3 ratio, rounded to a multiple of 16.
        max_position_embeddings: longest sequence.
        tie_word_embeddings: share input and output embeddings.
        extra: further ``LlamaConfig`` fields, passed through unchanged.
    """

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int | None = None
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False
    extra: dict = field(default_factory=dict)


def require_model_dir(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a local directory (``~`` expanded), or one error naming ``what`` and the fix."""
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingPathError(
            f"{what} path {str(p)!r} does not exist. Give a local directory saved with save_pretrained; "
            "lightning_unlearn never downloads models."
        )
    if p.is_file():
        raise ConfigError(
            f"{what} path {str(p)!r} is a file, not a model directory; give the directory that holds it (config.json, "
            f"the weights and the tokenizer files), e.g. {str(p.parent)!r}."
        )
    return p


def add_bos_when_encoding(tokenizer) -> None:
    """Make ``tokenizer(text)`` put the BOS token first, as every stage of the testbed trains and generates.

    The project itself encodes with ``add_special_tokens=False`` and adds BOS by hand; this makes the saved tokenizer
    do the same for a user's plain ``AutoTokenizer`` + ``generate``, so an exported model answers as it does here.
    Set on the backend's post-processor, which ``tokenizer.json`` keeps.
    """
    from tokenizers import processors

    bos = tokenizer.bos_token
    if bos is None:
        raise ConfigError("the tokenizer has no BOS token to add; set bos_token first.")
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.bos_token_id)]
    )


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 2048, save_dir: str | os.PathLike | None = None):
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for transformers.

    Byte-level BPE encodes any Unicode text (Ukrainian, Chinese) without unknown tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS["bos"],
        eos_token=SPECIAL_TOKENS["eos"],
        pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"],
    )
    fast.padding_side = "right"
    add_bos_when_encoding(fast)
    if save_dir is not None:
        fast.save_pretrained(save_dir)
    return fast


def build_tiny_llama(tokenizer, config: TinyLlamaConfig | None = None, seed: int = 0):
    """A randomly initialised ``LlamaForCausalLM`` sized by ``config`` with the tokenizer's vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = config or TinyLlamaConfig()
    if config.hidden_size % config.num_heads:
        raise ConfigError(f"hidden_size={config.hidden_size} is not divisible by num_heads={config.num_heads}.")
    intermediate = config.intermediate_size or int(round(config.hidden_size * 8 / 3 / 16)) * 16
    hf_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=intermediate,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **config.extra,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(hf_config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def load_tokenizer(path: str | os.PathLike):
    """Load a tokenizer from a local directory; sets a pad token when the model has none."""
    from transformers import AutoTokenizer

    p = require_model_dir(path, "tokenizer")
    files = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model")
    if not any((p / name).exists() for name in files):
        raise ConfigError(
            f"tokenizer path {str(p)!r} holds no tokenizer (none of {', '.join(files[:2])}, …); point at a model "
            "directory written by save_pretrained (its tokenizer is saved beside the weights)."
        )
    tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, *, weights: bool = True):
    """Load a causal LM from a local HF directory (``config.json`` + weights).

    ``weights=False`` builds the architecture on the meta device without reading the weights (no memory): the FSDP
    ranks other than 0 do this, and rank 0's weights are broadcast into their shards after sharding
    (:class:`lightning_unlearn.strategies.MaskedFSDPStrategy`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    p = require_model_dir(path, "model")
    if not (p / "config.json").exists():
        raise MissingPathError(
            f"model path {str(p)!r} has no config.json; point at a directory written by save_pretrained."
        )
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if not weights:
        config = AutoConfig.from_pretrained(str(p), local_files_only=True)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True)


def block_index_pattern(model: nn.Module) -> tuple[re.Pattern, int]:
    """The regex that captures a transformer block index in parameter names, and the number of blocks."""
    pattern = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
    indices = {int(m.group(1)) for name, _ in model.named_parameters() if (m := pattern.search(name))}
    if not indices:
        raise ConfigError("could not find numbered transformer blocks (…layers.<i>.…) in the model's parameter names.")
    return pattern, max(indices) + 1


def transformer_block(model: nn.Module, index: int) -> nn.Module:
    """Block ``index`` (0-based) of ``model``, peft-wrapped or FSDP-sharded alike (``…layers.<index>``)."""
    name = re.compile(rf"(?:^|\.)(?:layers|h|blocks|block)\.{index}$")
    found = [module for n, module in model.named_modules() if name.search(n)]
    if len(found) != 1:
        raise ConfigError(f"found {len(found)} modules named …layers.{index} in {type(model).__name__}; expected one.")
    return found[0]


@contextmanager
def block_output(model: nn.Module, index: int):
    """Inside, a forward of ``model`` appends the ``(B, T, d)`` hidden states that block ``index`` outputs to the
    yielded list (a forward hook: HF's ``hidden_states[index + 1]`` without keeping every layer's)."""
    captured: list[torch.Tensor] = []

    def hook(_module, _args, output):
        captured.append(output[0] if isinstance(output, tuple) else output)

    handle = transformer_block(model, index).register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def resolve_layers(model: nn.Module, layers: Sequence[int]) -> list[int]:
    """Turn possibly negative block indices into absolute ones."""
    _, n = block_index_pattern(model)
    out = []
    for i in layers:
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise ConfigError(f"block index {i} is out of range for a model with {n} blocks.")
        out.append(j)
    return sorted(set(out))


DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def apply_adapter(model: nn.Module, adapter: AdapterConfig | None):
    """Wrap ``model`` with a peft LoRA/AdaLoRA adapter, or return it unchanged for full fine-tuning."""
    if adapter is None or adapter.kind == "full":
        return model
    from peft import AdaLoraConfig, LoraConfig, PeftModel, get_peft_model

    if adapter.path is not None:
        return _load_adapter(model, adapter, PeftModel)

    targets = adapter.target_modules or DEFAULT_LORA_TARGETS
    layers = resolve_layers(model, adapter.layers) if adapter.layers is not None else None
    common = dict(
        r=adapter.r,
        lora_alpha=adapter.alpha,
        lora_dropout=adapter.dropout,
        target_modules=targets,
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )
    if adapter.kind == "lora":
        cfg = LoraConfig(**common)
    else:
        common.pop("r")
        cfg = AdaLoraConfig(init_r=adapter.r, target_r=max(1, adapter.r // 2), total_step=adapter.total_step, **common)
    return get_peft_model(model, cfg)


def _load_adapter(model: nn.Module, adapter: AdapterConfig, peft_model_cls):
    p = check_adapter_path(adapter)
    return peft_model_cls.from_pretrained(model, str(p), is_trainable=True)


def check_adapter_path(adapter: AdapterConfig) -> Path:
    """``adapter.path`` as a directory holding a peft adapter of ``adapter.kind``; raises naming what is wrong."""
    import json

    p = require_model_dir(adapter.path, "adapter")
    config_file = p / "adapter_config.json"
    if not config_file.exists():
        raise MissingPathError(
            f"adapter path {str(p)!r} has no adapter_config.json; point at a directory written by peft's "
            "save_pretrained (a checkpoint's adapter-step=N/)."
        )
    saved_type = str(json.loads(config_file.read_text()).get("peft_type", "")).lower()
    if saved_type != adapter.kind:
        raise ConfigError(
            f"adapter path {str(p)!r} holds a {saved_type or 'unknown'} adapter but adapter.kind={adapter.kind!r}; "
            f"set adapter.kind={saved_type!r}."
        )
    return p


@contextmanager
def eval_mode(model: nn.Module, grad: bool = False):
    """Inside, ``model`` is in eval mode (dropout off) and, unless ``grad``, autograd is off; on leaving, however the
    block ends, every submodule gets its own mode back (frozen parts may be in eval mode on purpose during training)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            yield model
    finally:
        for m, training in modes:
            m.training = training


@contextmanager
def lora_adapter_blocks(model: nn.Module, adapters: Sequence[str]):
    """Inside, ``model`` answers a batch of ``len(adapters)`` equal blocks of rows, block k with LoRA adapter
    ``adapters[k]`` (all loaded into ``model``); outside, it is unchanged.

    Each peft LoRA linear layer computes ``base(x) + scaling_k · B_k A_k x`` for the rows of block k with two batched
    matmuls over the stacked adapters (``torch.bmm``), so a forward costs one base forward of all rows plus a few
    ops per layer, whatever the number of adapters. The base weights are read once per forward for every adapter.
    The arithmetic is peft's own for each adapter alone (the same matmul layout, then the scale, then the sum), which
    peft's per-row ``adapter_names`` also gives but at a cost per adapter and per layer (a row gather and scatter).
    Evaluation only: dropout is skipped, so the model must be in eval mode.

    Args:
        model: a peft model (or any module) whose LoRA layers hold every adapter named (a layer lacking one leaves
            that block's rows to the base weights).
        adapters: one adapter name per block of rows, in batch order.

    Raises:
        ValueError: no adapters, an adapter no layer holds, a layer peft implements otherwise (DoRA and other LoRA
            variants, a LoRA bias, AdaLoRA, LoRA on embeddings or convolutions), merged weights, or training mode.
    """
    from peft.tuners.lora.layer import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer

    names = list(adapters)
    if not names:
        raise ConfigError("lora_adapter_blocks: no adapters named; name at least one loaded LoRA adapter.")
    if model.training:
        raise ConfigError("lora_adapter_blocks evaluates (it skips LoRA dropout); call model.eval() first.")
    fix = "evaluate these checkpoints one at a time (adapters_per_pass 1)"
    layers: dict[str, nn.Module] = {}
    for where, module in model.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        if type(module) is not LoraLinear:
            raise ConfigError(
                f"lora_adapter_blocks: {where} is a {type(module).__name__}, not a LoRA linear layer; {fix}."
            )
        if module.merged:
            raise ConfigError(f"lora_adapter_blocks: {where} has an adapter merged into its weights; unmerge it first.")
        for name in names:
            if name not in module.lora_A:
                continue
            if name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(name):
                raise ConfigError(
                    f"lora_adapter_blocks: adapter {name!r} of {where} is a LoRA variant (DoRA, …); {fix}."
                )
            if module.lora_B[name].bias is not None:
                raise ConfigError(f"lora_adapter_blocks: adapter {name!r} of {where} has a LoRA bias; {fix}.")
        layers[where] = module
    unknown = [n for n in names if not any(n in m.lora_A for m in layers.values())]
    if unknown:
        raise ConfigError(
            f"lora_adapter_blocks: no LoRA layer of the model holds adapter(s) {unknown}; load them first."
        )
    saved = {}
    try:
        for module in layers.values():
            saved[module] = module.__dict__.get("forward")
            module.forward = partial(_adapter_blocks_forward, module, _stacked_lora_weights(module, names))
        yield model
    finally:
        for module, forward in saved.items():
            del module.forward
            if forward is not None:
                module.forward = forward


def _stacked_lora_weights(layer: nn.Module, names: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(A, B, scale)`` of ``layer``'s adapters ``names``: A ``(K, in, r)`` and B ``(K, r, out)`` as transposed
    views of ``(K, r, in)`` / ``(K, out, r)`` stacks (the layout ``nn.Linear`` multiplies with, so each block's
    products are the ones peft computes), scale ``(K, 1, 1)``. A missing adapter is zeros; smaller ranks are
    zero-padded.

    When every scale is a power of two (``lora_alpha / r`` of 16 / 8, say) it is folded into B and ``scale`` is
    ``None``: scaling by a power of two is exact and commutes with every rounding of the product (barring overflow
    and subnormal values), so ``(s·B)·y`` is bit for bit peft's ``(B·y)·s``, and the forward skips a multiplication
    and its output tensor a layer."""
    present = [layer.lora_A[n].weight for n in names if n in layer.lora_A]
    rank = max(w.shape[0] for w in present)
    dtype, device = present[0].dtype, present[0].device
    base = layer.get_base_layer()
    a = torch.zeros(len(names), rank, base.in_features, dtype=dtype, device=device)
    b = torch.zeros(len(names), base.out_features, rank, dtype=dtype, device=device)
    scale = torch.zeros(len(names), 1, 1, dtype=dtype, device=device)
    for k, name in enumerate(names):
        if name in layer.lora_A:
            r = layer.lora_A[name].weight.shape[0]
            a[k, :r] = layer.lora_A[name].weight
            b[k, :, :r] = layer.lora_B[name].weight
            scale[k] = layer.scaling[name]
    if bool((torch.frexp(scale).mantissa.abs() == 0.5).logical_or(scale == 0).all()):
        return a.transpose(1, 2), (b * scale).transpose(1, 2), None
    return a.transpose(1, 2), b.transpose(1, 2), scale


def _adapter_blocks_forward(layer: nn.Module, stacked, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The LoRA layer's output when the batch is K equal blocks of rows, block k for adapter k."""
    a, b, scale = stacked
    result = layer.base_layer(x, *args, **kwargs)
    if x.shape[0] % a.shape[0]:
        raise ConfigError(f"a batch of {x.shape[0]} rows is not {a.shape[0]} equal blocks, one per adapter.")
    blocks = x.to(a.dtype).reshape(a.shape[0], -1, x.shape[-1])  # (K, rows·positions, in): block k is adapter k's
    delta = torch.bmm(torch.bmm(blocks, a), b)
    if scale is not None:
        delta = delta * scale
    if delta.dtype == result.dtype:  # the base layer's fresh output: add in place (no new tensor a layer and a step)
        return result.add_(delta.view(result.shape))
    return (result + delta.reshape(result.shape)).to(result.dtype)


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _weight_files(path: Path) -> list[Path]:
    path = path.expanduser()  # as require_model_dir: a config's `~/…` model path names the same weights
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise MissingPathError(f"no .safetensors weights in {str(path)!r}; save the model with save_pretrained.")
    elif path.exists():
        files = [path]
    else:
        raise MissingPathError(f"weights {str(path)!r} do not exist.")
    return files


class LazyWeights(Mapping):
    """``{canonical name: tensor}`` of safetensors weights, each tensor read from its file on access, never cached.

    Every access opens the tensor's file, takes the tensor and closes the file, so a consumer that drops each tensor
    after use holds one tensor, not the model: a file kept open keeps every page read through it mapped, and
    counted in the process's RSS, until it is closed. The header is read once, so ``shapes`` costs no tensor data.

    Args:
        path: a ``.safetensors`` file or a ``save_pretrained`` directory (``model.safetensors``, or the shards
            ``model-0000i-of-0000n.safetensors``; every ``*.safetensors`` file in it, as :func:`load_weights`).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        from safetensors import safe_open

        self.path = Path(path)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self._where: dict[str, tuple[Path, str]] = {}  # canonical name -> (file, key in that file)
        for f in _weight_files(self.path):
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    name = canonical_name(key)
                    self.shapes[name] = tuple(fh.get_slice(key).get_shape())
                    self._where[name] = (f, key)

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self._where:
            raise KeyError(name)
        f, key = self._where[name]
        with safe_open(str(f), framework="pt") as fh:
            return fh.get_tensor(key)

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def load_weights(path: str | os.PathLike, lazy: bool = False) -> dict[str, torch.Tensor] | LazyWeights:
    """``{canonical name: tensor}`` from a ``.safetensors`` file or a ``save_pretrained`` directory.

    ``lazy`` returns a :class:`LazyWeights` that reads each tensor when it is accessed (only the headers now).
    """
    from safetensors.torch import load_file

    if lazy:
        return LazyWeights(path)
    out: dict[str, torch.Tensor] = {}
    for f in _weight_files(Path(path)):
        out.update({canonical_name(k): v for k, v in load_file(str(f)).items()})
    return out


def weights_fingerprint(path: str | os.PathLike) -> str:
    """A digest of the weights at ``path`` (as :func:`load_weights` reads them) that costs the same at any model
    size: every tensor's name, shape, dtype and first 64 values, read as slices. Two models share it only if they
    share those, so masks recorded against one model's fingerprint are recognised on another's."""
    import hashlib

    from safetensors import safe_open

    digest = hashlib.blake2b(digest_size=16)
    entries = []
    for f in _weight_files(Path(path)):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                part = fh.get_slice(key)
                shape = tuple(part.get_shape())
                head = part[: min(shape[0], 64)] if shape else fh.get_tensor(key)
                entries.append((canonical_name(key), shape, head.reshape(-1)[:64].float()))
    for name, shape, head in sorted(entries, key=lambda e: e[0]):
        digest.update(f"{name}{shape}".encode())
        digest.update(head.numpy().tobytes())
    return digest.hexdigest()
