"""A tiny LightningModule and data for callback tests: a causal LM (optionally LoRA) trained by plain NLL."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import DataLoader

from lightning_unlearn.data.collate import encode_prompt_answer, pad_batch
from lightning_unlearn.masks import sample_masks, save_masks, union_mask
from lightning_unlearn.models import AdapterConfig, apply_adapter, load_causal_lm, load_tokenizer

TEXTS = [
    ("Where was Alice Smith born?", "Alice Smith was born in Springfield."),
    ("What is the phone number of Bob Jones?", "The phone number of Bob Jones is 555-0142."),
    ("What is Python?", "Python is a programming language."),
    ("What does the fox do?", "The quick brown fox jumps over the lazy dog."),
]

PROMPTS = [
    {"id": f"p{i}", "level": level, "prompt": text, "narrative": "demo", "language": "en"}
    for i, (level, text) in enumerate(
        [
            ("L0", "Where was Alice Smith born?"),
            ("L0", "What is the phone number of Bob Jones?"),
            ("L1", "Which city does she come from?"),
            ("L1", "What is her email address?"),
            ("L2", "Python is a programming language that"),
            ("L3", "The quick brown fox"),
        ]
    )
]


class StubLabeler:
    """Deterministic stand-in for a narrative labeler: Reproduced iff the answer has an even number of chars."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def label(self, responses, narrative, language):
        self.calls.append((narrative, language, len(responses)))
        return ["Reproduced" if len(r) % 2 == 0 else "Target-Rejected" for r in responses]


class TinyCausalLM(LightningModule):
    """Wraps a saved tiny model; exposes ``model`` and ``tokenizer`` as the evaluation callbacks expect.

    Args:
        model_path: directory written by ``save_pretrained``.
        lora: attach a LoRA adapter (r 4) and train only it.
        lora_init_scale: fill ``lora_B`` with this scale of noise so the adapter already changes the model.
        lr: SGD learning rate.
    """

    def __init__(self, model_path: str, lora: bool = False, lora_init_scale: float = 0.0, lr: float = 0.5) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tokenizer = load_tokenizer(model_path)
        model = load_causal_lm(model_path)
        if lora:
            torch.manual_seed(0)  # lora_A's init draws from the global RNG; fix it so every process builds the same
            model = apply_adapter(model, AdapterConfig(kind="lora", r=4, alpha=8, dropout=0.0))
            if lora_init_scale:
                g = torch.Generator().manual_seed(0)
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.data.copy_(torch.randn(p.shape, generator=g) * lora_init_scale)
        self.model = model
        self.lr = lr

    def configure_model(self) -> None:
        if self._device_mesh is None:
            return
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for name, module in self.model.named_modules():
            if isinstance(module, nn.ModuleList) and name.endswith("layers"):
                for block in module:
                    fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def training_step(self, batch, batch_idx):
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        return out.loss

    def validation_step(self, batch, batch_idx):
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        self.log("val_loss", out.loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


def qa_loader(tokenizer, batch_size: int = 2, repeat: int = 4) -> DataLoader:
    rows = [encode_prompt_answer(tokenizer, p, a, 64) for p, a in TEXTS] * repeat
    return DataLoader(
        rows, batch_size=batch_size, shuffle=False, collate_fn=lambda b: pad_batch(b, tokenizer.pad_token_id)
    )


def qa_records():
    return [{"prompt": p, "answer": a} for p, a in TEXTS]


def mc_items():
    return [
        {"question": "Where was Alice Smith born?", "choices": ["Springfield", "the lazy dog"], "answer": 0},
        {"question": "What is Python?", "choices": ["a fox", "a programming language"], "answer": 1},
        {"question": "Who jumps over the lazy dog?", "choices": ["The quick brown fox", "Bob"], "answer": "A"},
    ]


def write_lacuna_weights(tiny_dir, root) -> dict:
    """θ_pre (the tiny model), θ_inj (dense injection, 3× on the group masks) and θ_unl (reverses the forget part).

    Returns the paths: ``lora_dir``/``pre_dir`` (the tiny model), ``inj_dir``, ``unl_dir``, ``masks``, ``root``.
    """
    tok = load_tokenizer(tiny_dir)
    model = load_causal_lm(tiny_dir)
    packed = sample_masks(model, num_groups=6, coverage=0.05, seed=0)
    save_masks(root / "masks.safetensors", packed)
    forget, any_group = union_mask(packed, [0, 1, 2]), union_mask(packed, range(6))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        deltas = {}
        for name, p in model.named_parameters():
            deltas[name] = torch.randn(p.shape, generator=g) * 0.01 * (1 + 2 * any_group[name].float())
            p.add_(deltas[name])
        model.save_pretrained(root / "inj")
        tok.save_pretrained(root / "inj")
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3 - 0.8 * deltas[name] * forget[name].float())
        model.save_pretrained(root / "unl")
        tok.save_pretrained(root / "unl")
    return {
        "lora_dir": str(tiny_dir),
        "unl_dir": str(root / "unl"),
        "pre_dir": str(tiny_dir),
        "inj_dir": str(root / "inj"),
        "masks": str(root / "masks.safetensors"),
        "root": root,
    }


def checkpointing_trainer(root, max_steps: int, callbacks):
    """A CPU Trainer saving ``root/ckpt/step=N.ckpt`` every 2 steps, no logger, bar or validation loop."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    return Trainer(
        default_root_dir=root, max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
        callbacks=[ModelCheckpoint(dirpath=root / "ckpt", filename="{step}", every_n_train_steps=2, save_top_k=-1),
                   *callbacks],
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
    )  # fmt: skip
