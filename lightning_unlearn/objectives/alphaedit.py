"""AlphaEdit (Fang et al. 2025; Lacuna Sec. 4.1, Table 5): a null-space-projected closed-form edit of the MLP
down-projection weights W_out of early-mid layers, run as ``fit`` (one edit batch per training step).

For each batch of forget pairs (x, y), with p the last prompt position (the one that predicts y's first token):

1. **Target value (our unlearning target).** Let h be block ``layers[-1]``'s output at p. Optimise a residual
   delta δ per sample with Adam (``v_steps`` steps, lr ``v_lr``) to minimise
   ``mean_t −log(1 − π(y_t | ·))`` (unlikelihood of every answer token: bounded, and minimal when the answer is
   unlikely) ``+ kl_factor · KL(p_orig ‖ p_δ)`` (retain prompts with δ added at their last prompt position: the edit
   must not change what the model says elsewhere) ``+ v_weight_decay · ‖δ‖² / ‖h‖²``; after every step δ is clamped
   to ``‖δ‖ ≤ clamp_norm_factor · ‖h‖``. The target is z = h + δ.
2. **Keys.** K1 = down_proj inputs at p (columns, one per sample), per edited layer.
3. **Null-space projector.** P_l = U_0 U_0ᵀ with U_0 the eigenvectors of the covariance of K0 (down_proj inputs
   at every token of the retain set, on the unedited model) whose eigenvalue is below ``nullspace_threshold``.
   Updates ΔW P-projected leave the outputs for retain keys unchanged.
4. **Edit, layer by layer (MEMIT's spreading).** With cur_z the current block-``layers[-1]`` output at p and
   R = (z − cur_z) / (layers left), ``ΔW_l = R K1ᵀ P (K1 K1ᵀ P + C_prev P + l2·I)⁻¹`` (AlphaEdit's form, solved as
   ``solve(P (K1 K1ᵀ + C_prev) + l2·I, P K1 Rᵀ)ᵀ``), where C_prev accumulates the keys of earlier edit batches.

Lacuna 1B (Table 5): clamp 0.5, null-space threshold 1e-3, 50 v steps at lr 5e-2, v weight decay 1.0, KL factor
1.0, L2 1.0, layers 4-8, batch size 5; covariance data wikipedia + retain (here: the retain set).
Single process only: the edit is a closed form on full weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import move_data_to_device
from torch import nn
from typing_extensions import override

from lightning_unlearn.errors import ConfigError
from lightning_unlearn.losses import IGNORE_INDEX, kl_divergence, nll_loss, normalized_nll, sequence_logprobs
from lightning_unlearn.models import load_causal_lm, load_tokenizer
from lightning_unlearn.null_space import alphaedit_update, null_space_projector


class AlphaEdit(LightningModule):
    """Null-space-constrained closed-form edit of down-projection weights to make forget answers unlikely.

    Args:
        model_path: local model directory.
        layers: block indices whose down_proj is edited (early-mid layers; Lacuna 1B: 4-8).
        clamp_norm_factor: ‖δ‖ ≤ this · ‖h‖.
        nullspace_threshold: eigenvalues of the key covariance below this span the null space.
        v_steps: Adam steps for δ.
        v_lr: Adam learning rate for δ.
        v_weight_decay: weight of ‖δ‖² / ‖h‖².
        kl_factor: weight of the retain KL term of the δ objective.
        l2: ridge term of the closed-form solve.
        covariance_batches: retain batches used for the covariance of K0 (``None``: the whole retain set).
        block_path: attribute path of block ``{layer}`` in the model.
        down_proj_path: attribute path of block ``{layer}``'s MLP output projection.

    Raises:
        ValueError: ``block_path`` / ``down_proj_path`` names no module for one of ``layers``.

    Example::

        >>> import torch
        >>> from lightning_unlearn.null_space import null_space_projector
        >>> # retain keys span only e₁: AlphaEdit's projector lets the edit move e₂'s outputs alone
        >>> null_space_projector(torch.diag(torch.tensor([1.0, 0.0])), threshold=1e-3)
        tensor([[0., 0.],
                [0., 1.]], dtype=torch.float64)
    """

    def __init__(
        self,
        model_path: str,
        layers: list[int] | None = None,
        clamp_norm_factor: float = 0.5,
        nullspace_threshold: float = 1e-3,
        v_steps: int = 50,
        v_lr: float = 5e-2,
        v_weight_decay: float = 1.0,
        kl_factor: float = 1.0,
        l2: float = 1.0,
        covariance_batches: int | None = None,
        block_path: str = "model.layers.{layer}",
        down_proj_path: str = "model.layers.{layer}.mlp.down_proj",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.model = load_causal_lm(model_path).requires_grad_(False)
        self.tokenizer = load_tokenizer(model_path)
        self.layers = sorted(layers if layers is not None else [4, 5, 6, 7, 8])
        for layer in self.layers:
            self._down_proj(layer)  # fails early with a clear message
        self.clamp_norm_factor, self.nullspace_threshold = clamp_norm_factor, nullspace_threshold
        self.v_steps, self.v_lr, self.v_weight_decay, self.kl_factor, self.l2 = (
            v_steps,
            v_lr,
            v_weight_decay,
            kl_factor,
            l2,
        )
        self.covariance_batches = covariance_batches
        self.projectors: dict[int, torch.Tensor] = {}
        self.previous_keys: dict[int, torch.Tensor] = {}
        self.stop_reason: str | None = None

    # -- structure --------------------------------------------------------------------------------------------
    def _get(self, path: str, layer: int) -> nn.Module:
        try:
            return self.model.get_submodule(path.format(layer=layer))
        except AttributeError:
            raise ConfigError(
                f"AlphaEdit: the model has no module {path.format(layer=layer)!r}; check layers={self.layers} "
                "and block_path/down_proj_path for this architecture."
            ) from None

    def _down_proj(self, layer: int) -> nn.Linear:
        return self._get(self.hparams.down_proj_path, layer)

    def _block(self, layer: int) -> nn.Module:
        return self._get(self.hparams.block_path, layer)

    # -- Lightning --------------------------------------------------------------------------------------------
    @override
    def setup(self, stage: str) -> None:
        """Refuse more than one process: the edit is a closed form on full weights.

        Args:
            stage: the trainer's stage.

        Raises:
            RuntimeError: ``trainer.world_size`` > 1.
        """
        if self.trainer.world_size > 1:
            raise RuntimeError("AlphaEdit runs in one process (a closed-form edit of full weights); use devices=1.")

    @override
    def configure_optimizers(self):
        """An SGD at lr 0 over the edited weights, so Lightning counts one step per edit batch (no gradient step)."""
        # No gradient step: SGD over the edited weights only makes Lightning count one step per edit batch, so
        # max_steps and ModelCheckpoint(every_n_train_steps) work as for the other objectives.
        return torch.optim.SGD([self._down_proj(layer).weight for layer in self.layers], lr=0.0)

    @override
    def on_train_start(self) -> None:
        """Compute the null-space projector of each edited layer from the retain set (once; resumes keep theirs).

        Raises:
            TypeError: the datamodule has no ``retain_eval_dataloader`` (use ``ForgetRetainDataModule``).
        """
        if not self.projectors:
            datamodule = getattr(self.trainer, "datamodule", None)
            if not hasattr(datamodule, "retain_eval_dataloader"):
                raise TypeError("AlphaEdit takes its null-space statistics from ForgetRetainDataModule's retain set.")
            self.projectors = self.null_space_projectors(datamodule.retain_eval_dataloader())
        self.model.eval()

    @override
    def training_step(self, batch: dict, batch_idx: int) -> None:
        """Edit every layer's down_proj for one batch of forget pairs and log the forget NLL̄ and mean ‖δ‖.

        Args:
            batch: ``{"forget", "retain"}`` LM batches; retain prompts anchor δ's KL term.
            batch_idx: the batch's index.

        Raises:
            ValueError: a pair without an answer token (from ``_last_prompt_positions``).
        """
        forget = batch["forget"]
        positions = _last_prompt_positions(forget["labels"])
        targets, delta_norm = self.target_values(forget, positions, batch["retain"])
        for i, layer in enumerate(self.layers):
            keys, current = self._keys_and_values(forget, positions, layer)
            residual = (targets - current) / (len(self.layers) - i)  # (B, d)
            self._edit(layer, keys, residual)
        with torch.no_grad():
            logps, lengths = sequence_logprobs(self._logits(forget), forget["labels"])
        self.log_dict({"train/forget_nll": normalized_nll(logps, lengths).mean(), "train/delta_norm": delta_norm})
        self.optimizers().step()  # counts the edit batch as one step (no gradients, so nothing else happens)

    @override
    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Log the mean answer NLL̄ of a validation batch as ``val/forget_nll``, ``val/retain_nll`` or ``val/set<i>``.

        Args:
            batch: an LM batch.
            batch_idx: the batch's index.
            dataloader_idx: 0 = forget, 1 = retain, further loaders ``set<i>``.
        """
        logps, lengths = sequence_logprobs(self._logits(batch), batch["labels"])
        name = ("forget", "retain")[dataloader_idx] if dataloader_idx < 2 else f"set{dataloader_idx}"
        self.log(f"val/{name}_nll", nll_loss(logps, lengths), add_dataloader_idx=False, batch_size=len(logps))

    def _logits(self, batch: dict) -> torch.Tensor:
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    # -- the edit ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def null_space_projectors(self, loader) -> dict[int, torch.Tensor]:
        """P_l for every edited layer from the covariance of down_proj inputs on ``loader``'s tokens."""
        sums: dict[int, torch.Tensor] = {}
        counts = 0
        captured: dict[int, torch.Tensor] = {}
        hooks = [
            self._down_proj(layer).register_forward_pre_hook(
                lambda _m, args, layer=layer: captured.__setitem__(layer, args[0].detach())
            )
            for layer in self.layers
        ]
        try:
            for i, batch in enumerate(loader):
                if self.covariance_batches is not None and i >= self.covariance_batches:
                    break
                batch = move_data_to_device(batch, self.device)
                self._logits(batch)
                keep = batch["attention_mask"].bool()
                for layer in self.layers:
                    k = captured[layer][keep].double()  # (tokens, d_ff)
                    sums[layer] = sums.get(layer, 0) + k.T @ k
                counts += int(keep.sum())
        finally:
            for h in hooks:
                h.remove()
        return {
            layer: null_space_projector(sums[layer] / max(counts, 1), self.nullspace_threshold) for layer in self.layers
        }

    def target_values(self, forget: dict, positions: torch.Tensor, retain: dict) -> tuple[torch.Tensor, float]:
        """z = h + δ at block ``layers[-1]``'s output, position p of each forget sample; also mean ‖δ‖."""
        block = self._block(self.layers[-1])
        rows = torch.arange(len(positions), device=positions.device)
        with torch.no_grad():
            hidden = {}
            handle = block.register_forward_hook(lambda _m, _a, out: hidden.__setitem__("h", _hidden(out).detach()))
            self._logits(forget)
            handle.remove()
            h = hidden["h"][rows, positions]  # (B, d)
            retain_positions = _last_prompt_positions(retain["labels"])
            reference_retain = self._logits(retain)
        h_norm = h.norm(dim=-1, keepdim=True)
        delta = torch.zeros_like(h, requires_grad=True)
        optimizer = torch.optim.Adam([delta], lr=self.v_lr)
        answer = forget["labels"][:, 1:]
        answer_mask = answer != IGNORE_INDEX
        for _ in range(self.v_steps):
            with torch.enable_grad():
                logits = self._with_delta(block, delta, positions, forget)
                logp = F.log_softmax(logits[:, :-1].float(), -1).gather(-1, answer.clamp(min=0)[..., None])[..., 0]
                # Unlikelihood: −log(1 − π(y_t)), computed stably as −log(−expm1(log π)).
                unlikely = -torch.log(-torch.expm1(logp.clamp(max=-1e-6)))
                loss = ((unlikely * answer_mask).sum(-1) / answer_mask.sum(-1).clamp(min=1)).mean()
                if self.kl_factor:
                    # δ_b is added to retain sample b mod R at its last prompt position.
                    idx = torch.arange(len(retain_positions), device=delta.device) % len(delta)
                    edited = self._with_delta(block, delta[idx], retain_positions, retain)
                    loss = loss + self.kl_factor * kl_divergence(edited, reference_retain, retain["labels"])
                loss = loss + self.v_weight_decay * ((delta.norm(dim=-1) / h_norm[:, 0]) ** 2).mean()
                optimizer.zero_grad()
                loss.backward()
            optimizer.step()
            with torch.no_grad():
                limit = self.clamp_norm_factor * h_norm
                delta.mul_(torch.clamp(limit / delta.norm(dim=-1, keepdim=True).clamp(min=1e-12), max=1.0))
        return (h + delta).detach(), float(delta.detach().norm(dim=-1).mean())

    def _with_delta(self, block: nn.Module, delta: torch.Tensor, positions: torch.Tensor, batch: dict):
        rows = torch.arange(len(positions), device=positions.device)

        def add_delta(_module, _args, out):
            hidden = _hidden(out)
            hidden = hidden.index_put((rows, positions), hidden[rows, positions] + delta)
            return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

        handle = block.register_forward_hook(add_delta)
        try:
            return self._logits(batch)
        finally:
            handle.remove()

    @torch.no_grad()
    def _keys_and_values(self, forget: dict, positions: torch.Tensor, layer: int):
        """K1 at ``layer`` ((d_ff, B)) and the current block-``layers[-1]`` output at p ((B, d))."""
        captured = {}
        rows = torch.arange(len(positions), device=positions.device)
        pre = self._down_proj(layer).register_forward_pre_hook(lambda _m, a: captured.__setitem__("k", a[0]))
        post = self._block(self.layers[-1]).register_forward_hook(
            lambda _m, _a, out: captured.__setitem__("z", _hidden(out))
        )
        try:
            self._logits(forget)
        finally:
            pre.remove()
            post.remove()
        return captured["k"][rows, positions].T.float(), captured["z"][rows, positions].float()

    @torch.no_grad()
    def _edit(self, layer: int, keys: torch.Tensor, residual: torch.Tensor) -> None:
        weight = self._down_proj(layer).weight  # (d, d_ff)
        projector = self.projectors[layer].to(weight.device, torch.float64)
        previous = self.previous_keys.get(layer)
        update = alphaedit_update(keys, residual, projector, previous, self.l2)  # (d_ff, d)
        weight.add_(update.T.to(weight.dtype))
        keys = keys.double()
        self.previous_keys[layer] = (keys @ keys.T) + (0 if previous is None else previous.to(keys.device))

    # -- resume -----------------------------------------------------------------------------------------------
    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Save the projectors and the accumulated keys of earlier edits, without which a resume would undo them.

        Args:
            checkpoint: the checkpoint dict being saved (``alphaedit`` is added).
        """
        super().on_save_checkpoint(checkpoint)
        # The projectors and the accumulated keys of earlier edit batches are the edit's state: without them a
        # resumed run would recompute P from the already-edited model and forget to preserve earlier edits.
        checkpoint["alphaedit"] = {
            "projectors": {int(k): v.cpu() for k, v in self.projectors.items()},
            "previous_keys": {int(k): v.cpu() for k, v in self.previous_keys.items()},
        }

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the projectors and accumulated keys of a checkpoint.

        Args:
            checkpoint: the loaded checkpoint dict.
        """
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("alphaedit") or {}
        self.projectors = {int(k): v for k, v in state.get("projectors", {}).items()}
        self.previous_keys = {int(k): v for k, v in state.get("previous_keys", {}).items()}


def _hidden(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _last_prompt_positions(labels: torch.Tensor) -> torch.Tensor:
    """Index of the last prompt token of each row (the position whose logits predict the first answer token)."""
    is_answer = labels != IGNORE_INDEX
    if not bool(is_answer.any(-1).all()):
        raise ConfigError("AlphaEdit: every forget/retain pair needs at least one answer token.")
    first_answer = is_answer.float().argmax(-1)
    return (first_answer - 1).clamp(min=0)
