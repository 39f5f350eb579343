"""Pure loss math for unlearning objectives. Imports torch only.

Conventions: ``labels`` are the input ids shifted by nothing (HF causal-LM style): position ``t`` of
``logits`` predicts ``labels[t + 1]``; prompt and padding positions carry ``IGNORE_INDEX`` (-100).
Per-sequence quantities are returned with shape ``(B,)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightning_unlearn.errors import ConfigError

IGNORE_INDEX = -100


def answer_token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of every next token and which positions are answer tokens.

    Args:
        logits: ``(B, T, V)``.
        labels: ``(B, T)`` with ``IGNORE_INDEX`` on prompt and padding.

    Returns:
        ``(token_logps, answer_mask)``, both ``(B, T-1)``; ``token_logps`` is 0 where ``answer_mask`` is False.
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    answer_mask = shift_labels != IGNORE_INDEX
    safe_labels = shift_labels.masked_fill(~answer_mask, 0)
    # log_softmax + gather == -cross_entropy per token; cross_entropy avoids materialising (B, T, V) log-probs twice.
    token_logps = -F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), safe_labels.reshape(-1), reduction="none"
    ).view_as(safe_labels)
    return token_logps * answer_mask, answer_mask


def sequence_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y|x) summed over answer tokens only, and |y| (answer-token count), both ``(B,)``."""
    token_logps, answer_mask = answer_token_logprobs(logits, labels)
    return token_logps.sum(-1), answer_mask.sum(-1)


# ---------------------------------------------------------------------------------------------------------------
# Objective terms. ``*_logps`` are per-sequence sums of answer-token log-probs, shape ``(B,)`` (see
# ``sequence_logprobs``); ``answer_lengths`` are |y| per sequence, shape ``(B,)``. Every function returns a scalar:
# the batch mean.
# ---------------------------------------------------------------------------------------------------------------


def normalized_nll(logps: torch.Tensor, answer_lengths: torch.Tensor) -> torch.Tensor:
    """Per-sequence length-normalised negative log-likelihood NLL̄ = −log π(y|x) / |y|, shape ``(B,)``.

    Sequences without answer tokens count as length 1 (their log-prob is 0, so their NLL̄ is 0).
    """
    return -logps / answer_lengths.clamp(min=1).to(logps.dtype)


TOKEN_AVERAGES = ("sequence", "batch")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else one clear error naming ``name`` and the choices."""
    if value not in choices:
        raise ConfigError(f"{name}={value!r}; use one of {', '.join(choices)}.")
    return value


def nll_loss(logps: torch.Tensor, answer_lengths: torch.Tensor, token_average: str = "sequence") -> torch.Tensor:
    """Mean answer NLL of a batch.

    Args:
        logps: ``(B,)`` summed answer log-probs.
        answer_lengths: ``(B,)`` answer-token counts |y|.
        token_average: ``sequence`` = mean_i −log π(y_i|x_i) / |y_i| (each sequence weighs the same; the default,
            as DESIGN's NLL̄); ``batch`` = −Σ_i log π(y_i|x_i) / Σ_i |y_i| (each answer *token* weighs the same:
            HF's causal-LM loss over the batch, which OpenUnlearning's GA/GD use). They differ when answer lengths
            differ within a batch.
    """
    if check_choice("token_average", token_average, TOKEN_AVERAGES) == "sequence":
        return normalized_nll(logps, answer_lengths).mean()
    return -logps.sum() / answer_lengths.sum().clamp(min=1).to(logps.dtype)


def ga_loss(forget_logps: torch.Tensor, forget_lengths: torch.Tensor, token_average: str = "sequence") -> torch.Tensor:
    """Gradient ascent (TOFU-GA; LENS Sec. 5): L = −NLL̄(forget). Minimising it raises the forget NLL.

    ``token_average`` as in :func:`nll_loss` (``batch`` = OpenUnlearning's convention).
    """
    return -nll_loss(forget_logps, forget_lengths, token_average)


def gd_loss(
    forget_logps: torch.Tensor,
    forget_lengths: torch.Tensor,
    retain_logps: torch.Tensor,
    retain_lengths: torch.Tensor,
    gamma: float = 1.0,
    alpha: float = 1.0,
    token_average: str = "sequence",
) -> torch.Tensor:
    """Gradient difference (TOFU-GD; Lacuna's OracleGrad objective): L = γ·(−NLL̄(forget)) + α·NLL̄(retain).

    ``token_average`` as in :func:`nll_loss`, for both terms (``batch`` = OpenUnlearning's convention).
    """
    return gamma * ga_loss(forget_logps, forget_lengths, token_average) + alpha * nll_loss(
        retain_logps, retain_lengths, token_average
    )


def npo_loss(policy_logps: torch.Tensor, reference_logps: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """Negative preference optimisation (Zhang et al. 2024; LENS Sec. 5).

    L = −(2/β) · mean_i log σ(−β · (log π_θ(y_i|x_i) − log π_ref(y_i|x_i))).

    At π_θ = π_ref every term is log σ(0) = −log 2, so L = (2/β)·log 2. ``logsigmoid`` keeps it finite for any
    log-ratio (a naive ``log(sigmoid(·))`` underflows to −inf once the policy has moved far from the reference).

    Args:
        policy_logps: ``(B,)`` summed answer log-probs under the trained model.
        reference_logps: ``(B,)`` the same under the frozen reference model (no gradient needed).
        beta: inverse temperature β > 0.
    """
    if beta <= 0:
        raise ConfigError(f"npo beta must be positive, got {beta}.")
    log_ratio = policy_logps - reference_logps
    return -(2.0 / beta) * F.logsigmoid(-beta * log_ratio).mean()


def simnpo_loss(
    policy_logps: torch.Tensor, answer_lengths: torch.Tensor, beta: float = 10.0, delta: float = 1.5
) -> torch.Tensor:
    """SimNPO forget loss (Fan et al. 2025; Lacuna App. D), reference-free and length-normalised.

    L_f = −(2/β) · mean_i log σ(−(β/|y_i|) · log π_θ(y_i|x_i) − δ); the margin δ sits outside β, as Lacuna App. D
    writes it. OpenUnlearning's code computes log σ(β·(NLL_i/|y_i| − δ_OU)) instead, i.e. δ = β·δ_OU here: a run
    reported with OpenUnlearning's β 10, δ 1.5 is ``beta=10, delta=15`` in this function.

    Args:
        policy_logps: ``(B,)`` summed answer log-probs under the trained model.
        answer_lengths: ``(B,)`` answer-token counts |y|.
        beta: temperature β > 0.
        delta: reward margin δ ≥ 0.
    """
    if beta <= 0:
        raise ConfigError(f"simnpo beta must be positive, got {beta}.")
    reward = beta * policy_logps / answer_lengths.clamp(min=1).to(policy_logps.dtype)
    return -(2.0 / beta) * F.logsigmoid(-reward - delta).mean()


KL_POSITIONS = ("answer", "all")


def kl_divergence(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    labels: torch.Tensor,
    positions: str = "answer",
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(p_ref ‖ p_θ) of the full next-token distributions, averaged over positions of the batch.

    KL = mean over the chosen positions t of Σ_v p_ref(v) · (log p_ref(v) − log p_θ(v)). This is GA-Retain's
    normal-data term (Yao et al. 2024) and the retain-drift KL of the evaluation.

    Args:
        policy_logits: ``(B, T, V)`` logits of the trained model.
        reference_logits: ``(B, T, V)`` logits of the frozen reference on the same inputs.
        labels: ``(B, T)`` HF-style labels.
        positions: ``answer`` (default) = positions t that predict an answer token (``labels[t+1] !=
            IGNORE_INDEX``); ``all`` = every position of the sequence, prompt and the last one included, as
            OpenUnlearning's ``kl_div(..., reduction="batchmean")`` over the flattened logits (which also counts
            padding; pass ``attention_mask`` to leave it out — on an unpadded batch the two agree).
        attention_mask: ``(B, T)``, with ``positions="all"``: 0 marks padding.
    """
    if check_choice("positions", positions, KL_POSITIONS) == "answer":
        mask = labels[:, 1:] != IGNORE_INDEX
        policy_logits, reference_logits = policy_logits[:, :-1], reference_logits[:, :-1]
    else:
        mask = torch.ones(labels.shape, dtype=torch.bool, device=labels.device)
        if attention_mask is not None:
            mask = attention_mask.bool()
    per_position = _kl_per_position(policy_logits, reference_logits)
    return (per_position * mask).sum() / mask.sum().clamp(min=1)


def sequence_kl(policy_logits: torch.Tensor, reference_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sequence KL(p_ref ‖ p_θ): for each row, the mean over its answer positions t (those predicting a label,
    ``labels[t+1] != IGNORE_INDEX``) of Σ_v p_ref(v) · (log p_ref(v) − log p_θ(v)), shape ``(B,)``.

    The per-sample form of :func:`kl_divergence` (which averages over the batch's positions), for losses that are a
    mean over samples — the masked-gradient contract. A row without answer positions gives 0. ``reference_logits``
    may be log-probabilities already (``log_softmax`` leaves them unchanged).
    """
    mask = labels[:, 1:] != IGNORE_INDEX
    per_position = _kl_per_position(policy_logits[:, :-1], reference_logits[:, :-1])
    return (per_position * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _kl_per_position(policy_logits: torch.Tensor, reference_logits: torch.Tensor) -> torch.Tensor:
    log_p = F.log_softmax(policy_logits.float(), dim=-1)
    log_ref = F.log_softmax(reference_logits.float(), dim=-1)
    return (log_ref.exp() * (log_ref - log_p)).sum(-1)


def ga_retain_loss(
    forget_logps: torch.Tensor,
    forget_lengths: torch.Tensor,
    mismatch_logps: torch.Tensor,
    mismatch_lengths: torch.Tensor,
    retain_kl: torch.Tensor,
    forget_weight: float = 0.5,
    random_weight: float = 1.0,
    kl_weight: float = 1.0,
) -> torch.Tensor:
    """GA-Retain (Yao et al. 2024, "Large Language Model Unlearning"; LENS Sec. 5).

    L = w_f·(−NLL̄(forget)) + w_r·NLL̄(forget prompt, random retain answer) + w_n·KL(p_ref ‖ p_θ)(retain).

    Args:
        forget_logps, forget_lengths: ``(B,)`` answer log-probs and lengths of the forget pairs.
        mismatch_logps, mismatch_lengths: ``(B,)`` the same for forget prompts paired with random retain answers.
        retain_kl: scalar KL(p_ref ‖ p_θ) on retain text (``kl_divergence``).
        forget_weight, random_weight, kl_weight: w_f, w_r, w_n (Yao et al.: 0.5, 1, 1).
    """
    return (
        forget_weight * ga_loss(forget_logps, forget_lengths)
        + random_weight * nll_loss(mismatch_logps, mismatch_lengths)
        + kl_weight * retain_kl
    )


def weighted_nll_loss(
    forget_logps: torch.Tensor,
    forget_lengths: torch.Tensor,
    retain_logps: torch.Tensor,
    retain_lengths: torch.Tensor,
    forget_factor: float = -0.6,
    retain_factor: float = 2.0,
) -> torch.Tensor:
    """MemFlex's update loss (Tian et al. 2024; Lacuna G.2): per-sample factors on length-normalised NLL.

    L = forget_factor · NLL̄(forget) + retain_factor · NLL̄(retain); a negative forget factor ascends on forget.
    """
    return forget_factor * nll_loss(forget_logps, forget_lengths) + retain_factor * nll_loss(
        retain_logps, retain_lengths
    )


def idk_nll_loss(
    idk_logps: torch.Tensor,
    idk_lengths: torch.Tensor,
    retain_logps: torch.Tensor,
    retain_lengths: torch.Tensor,
    gamma: float = 1.0,
    alpha: float = 1.0,
    token_average: str = "sequence",
) -> torch.Tensor:
    """IdkNLL (TOFU's "I don't know" baseline; Maini et al. 2024): L = γ·NLL̄(forget prompt, idk answer) + α·NLL̄(retain).

    Gradient *descent* on an "I don't know" answer to each forget prompt, so the forget answer is replaced by a
    refusal rather than pushed down. ``token_average`` as in :func:`nll_loss` (``batch`` = TOFU's and
    OpenUnlearning's HF mean over the batch's answer tokens, per term).

    Args:
        idk_logps, idk_lengths: ``(B,)`` summed log-probs and lengths of the idk answers to the forget prompts.
        retain_logps, retain_lengths: ``(B_r,)`` the same for the retain pairs.
        gamma, alpha: weights γ (idk term) and α (retain term).
    """
    return gamma * nll_loss(idk_logps, idk_lengths, token_average) + alpha * nll_loss(
        retain_logps, retain_lengths, token_average
    )


DPO_SCALES = ("one", "two_over_beta")


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    scale: str = "one",
) -> torch.Tensor:
    """Direct preference optimisation (Rafailov et al. 2023, Eq. 7); TOFU's IdkDPO with chosen = an idk answer.

    L = −c · mean_i log σ(β·[(log π_θ(y_w,i|x_i) − log π_ref(y_w,i|x_i)) − (log π_θ(y_l,i|x_i) − log π_ref(y_l,i|x_i))])

    with y_w the preferred (chosen) and y_l the dispreferred (rejected: the forget) answer. At π_θ = π_ref,
    L = c·log 2. ``scale`` sets c: ``one`` (the paper's DPO) or ``two_over_beta`` (c = 2/β, as OpenUnlearning's
    ``compute_dpo_loss`` writes it, NPO's scaling; 20× at β 0.1, which with Adam mainly shifts the balance against
    a retain term).

    Args:
        chosen_logps, rejected_logps: ``(B,)`` summed answer log-probs of y_w and y_l under the trained model.
        reference_chosen_logps, reference_rejected_logps: ``(B,)`` the same under the frozen reference.
        beta: inverse temperature β > 0.
        scale: ``one`` or ``two_over_beta``.
    """
    if beta <= 0:
        raise ConfigError(f"dpo beta must be positive, got {beta}.")
    factor = 1.0 if check_choice("scale", scale, DPO_SCALES) == "one" else 2.0 / beta
    margin = (chosen_logps - reference_chosen_logps) - (rejected_logps - reference_rejected_logps)
    return -factor * F.logsigmoid(beta * margin).mean()


def answer_token_mean(values: torch.Tensor, answer_mask: torch.Tensor, token_average: str = "sequence") -> torch.Tensor:
    """Mean of a per-token quantity over answer tokens, ``(B, T-1)`` → scalar.

    ``sequence``: mean_i (Σ_t values_it / |y_i|) (each sequence weighs the same; a sequence without answer tokens
    counts 0); ``batch``: Σ_it values_it / Σ_i |y_i| (each answer token weighs the same, OpenUnlearning's mean over
    the batch's valid tokens).
    """
    masked = values * answer_mask
    if check_choice("token_average", token_average, TOKEN_AVERAGES) == "sequence":
        return (masked.sum(-1) / answer_mask.sum(-1).clamp(min=1).to(values.dtype)).mean()
    return masked.sum() / answer_mask.sum().clamp(min=1).to(values.dtype)


def undial_loss(
    policy_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    strength: float = 10.0,
    token_average: str = "sequence",
) -> torch.Tensor:
    """UNDIAL (Dong et al. 2024, "UNDIAL: Self-Distillation with Adjusted Logits for Robust Unlearning in LLMs").

    Self-distillation toward the start model with the target token's logit lowered by γ (``strength``):

        q_t = softmax(z_ref,t − γ·e_{y_t}),   L = mean over answer tokens t of H(q_t, p_θ,t) = −Σ_v q_t(v) log p_θ,t(v),

    where z_ref,t are the frozen start model's logits at position t, y_t the forget token they predict and p_θ,t the
    trained model's next-token distribution. H(q, p_θ) = KL(q ‖ p_θ) + H(q): the same gradient as the KL.
    OpenUnlearning (``compute_undial_loss``) takes the mean over every position of the batch, prompt and padding
    included (there its −100 label index wraps to lowering vocabulary entry V−100); here only answer tokens count,
    and on a batch whose every position is an answer token ``token_average="batch"`` equals it.

    Args:
        policy_logits: ``(B, T, V)`` logits of the trained model.
        teacher_logits: ``(B, T, V)`` logits of the frozen start model on the same inputs (no gradient needed).
        labels: ``(B, T)`` HF-style labels, ``IGNORE_INDEX`` on prompt and padding.
        strength: γ ≥ 0 (OpenUnlearning's ``beta``, 10 in its UNDIAL config); 0 distils onto the start model.
        token_average: ``sequence`` or ``batch``, as in :func:`answer_token_mean`.
    """
    if strength < 0:
        raise ConfigError(f"undial strength must be non-negative, got {strength}.")
    shift_labels = labels[:, 1:]
    answer_mask = shift_labels != IGNORE_INDEX
    safe_labels = shift_labels.masked_fill(~answer_mask, 0).unsqueeze(-1)  # (B, T-1, 1)
    teacher = teacher_logits[:, :-1].float().detach()
    adjusted = teacher.scatter_add(-1, safe_labels, torch.full_like(safe_labels, -strength, dtype=teacher.dtype))
    soft_target = F.softmax(adjusted, dim=-1)
    cross_entropy = -(soft_target * F.log_softmax(policy_logits[:, :-1].float(), dim=-1)).sum(-1)  # (B, T-1)
    return answer_token_mean(cross_entropy, answer_mask, token_average)


def token_weighted_ga_loss(
    token_logps: torch.Tensor, answer_mask: torch.Tensor, weights: torch.Tensor, token_average: str = "sequence"
) -> torch.Tensor:
    """Token-weighted gradient ascent: L = mean over answer tokens of w_t · log π_θ(y_t|·) = −mean w_t·NLL_t.

    ``weights`` ``(B, T-1)`` are constants (detached): they scale each token's gradient, not what it points to.
    """
    return answer_token_mean(weights.detach() * token_logps, answer_mask, token_average)


def wga_loss(
    token_logps: torch.Tensor, answer_mask: torch.Tensor, beta: float = 1.0, token_average: str = "sequence"
) -> torch.Tensor:
    """Weighted gradient ascent, WGA (Wang et al. 2025, "Rethinking LLM Unlearning Objectives: A Gradient Perspective
    and Go Beyond"; OpenUnlearning's ``compute_wga_loss``).

    w_t = p_t^β with p_t = π_θ(y_t|x, y_<t) detached; L = −mean_t w_t·NLL_t. Tokens the model still predicts
    confidently get the largest push; tokens already forgotten (p_t → 0) stop contributing, which keeps GA from
    diverging.

    Args:
        token_logps, answer_mask: ``(B, T-1)`` from :func:`answer_token_logprobs`.
        beta: the weight's power β ≥ 0 (OpenUnlearning 1.0); 0 is plain GA.
        token_average: ``sequence`` or ``batch`` (OpenUnlearning's), as in :func:`answer_token_mean`.
    """
    weights = (beta * token_logps.detach()).exp()
    return token_weighted_ga_loss(token_logps, answer_mask, weights, token_average)


def satimp_loss(
    token_logps: torch.Tensor,
    answer_mask: torch.Tensor,
    beta1: float = 5.0,
    beta2: float = 1.0,
    token_average: str = "sequence",
) -> torch.Tensor:
    """SatImp (Yang et al. 2025, "Exploring Criteria of Loss Reweighting to Enhance LLM Unlearning"; OpenUnlearning's
    ``compute_satimp_loss``): saturation × importance token weights on gradient ascent.

    w_t = p_t^β1 · (1 − p_t)^β2 with p_t = π_θ(y_t|x, y_<t) detached; L = −mean_t w_t·NLL_t. 1 − p_t is computed
    as −expm1(log p_t), exact for p_t near 1.

    Args:
        token_logps, answer_mask: ``(B, T-1)`` from :func:`answer_token_logprobs`.
        beta1: power of p_t (OpenUnlearning 5.0).
        beta2: power of 1 − p_t (OpenUnlearning 1.0).
        token_average: ``sequence`` or ``batch`` (OpenUnlearning's), as in :func:`answer_token_mean`.
    """
    logp = token_logps.detach()
    weights = (beta1 * logp).exp() * (-torch.expm1(logp)).pow(beta2)
    return token_weighted_ga_loss(token_logps, answer_mask, weights, token_average)


# ---------------------------------------------------------------------------------------------------------------
# Representation-level: RMU. ``activations`` are the hidden states output by one transformer block, ``(B, T, d)``.
# ---------------------------------------------------------------------------------------------------------------

RMU_POSITIONS = ("answer", "all")


def rmu_control_vector(hidden_size: int, steering_coeff: float, seed: int) -> torch.Tensor:
    """RMU's target c·u, shape ``(d,)``: u ~ U[0, 1)^d normalised to unit length (the WMDP reference code's draw,
    as OpenUnlearning's ``get_control_vector``), from a generator seeded with ``seed`` so every rank and every
    rebuild draws the same u."""
    generator = torch.Generator().manual_seed(seed)
    direction = torch.rand(hidden_size, generator=generator)
    return steering_coeff * direction / direction.norm()


def rmu_positions(labels: torch.Tensor, attention_mask: torch.Tensor, positions: str = "answer") -> torch.Tensor:
    """Which hidden states RMU's terms average over, ``(B, T)`` bool.

    ``answer``: the positions of answer tokens (``labels != IGNORE_INDEX``, unshifted: the hidden state *of* each
    answer token, as OpenUnlearning's ``compute_activation_loss`` masks); ``all``: every non-padding position,
    prompt included (the WMDP reference code averages over every position of its plain-text corpora, padding too;
    on an unpadded batch the two agree).
    """
    if check_choice("positions", positions, RMU_POSITIONS) == "answer":
        return labels != IGNORE_INDEX
    return attention_mask.bool()


def activation_mse(
    activations: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, token_average: str = "sequence"
) -> torch.Tensor:
    """Mean over the masked positions of (1/d)·‖h_t − target_t‖², the reference code's ``mse_loss`` per position.

    OpenUnlearning's ``compute_activation_loss`` means the ``sequence`` average, but divides the ``(B,)`` per-sample
    sums by token counts of shape ``(B, 1)``, a ``(B, B)`` broadcast: its value is the per-sample mean only at batch
    size 1 (its WMDP experiment's), otherwise mean_i(sum_i)·mean_j(1/n_j). This function does not copy that.

    Args:
        activations: ``(B, T, d)``.
        targets: ``(B, T, d)`` or anything that broadcasts to it (RMU's ``(d,)`` control vector).
        mask: ``(B, T)`` positions that count.
        token_average: ``sequence`` (each sequence weighs the same, a sequence without positions counts 0:
            OpenUnlearning's mean of per-sample means) or ``batch`` (each position weighs the same: the WMDP
            reference code's mean over the batch), as in :func:`answer_token_mean`.
    """
    squared = (activations.float() - targets.float()).pow(2).mean(-1)  # (B, T)
    return answer_token_mean(squared, mask, token_average)


def rmu_forget_loss(
    activations: torch.Tensor, control_vector: torch.Tensor, mask: torch.Tensor, token_average: str = "sequence"
) -> torch.Tensor:
    """RMU's forget term (Li et al. 2024, "The WMDP Benchmark", Sec. 5, Algorithm 1): push the hidden states of
    block ℓ on forget text toward the fixed random direction c·u.

        L_forget = mean over forget positions t of (1/d)·‖h_ℓ,t(x_f) − c·u‖².

    The paper writes ‖·‖² summed over d; its reference code (and OpenUnlearning's) takes ``mse_loss``, the mean
    over d, as here: the paper's value is d times this one, for both terms alike.

    Args:
        activations: ``(B, T, d)`` block-ℓ output of the trained model on the forget batch.
        control_vector: ``(d,)`` c·u from :func:`rmu_control_vector`.
        mask: ``(B, T)`` from :func:`rmu_positions`.
        token_average: ``sequence`` or ``batch``, as in :func:`activation_mse`.
    """
    return activation_mse(activations, control_vector, mask, token_average)


def rmu_retain_loss(
    activations: torch.Tensor, frozen_activations: torch.Tensor, mask: torch.Tensor, token_average: str = "sequence"
) -> torch.Tensor:
    """RMU's retain term (Li et al. 2024, Algorithm 1): keep block ℓ's hidden states on retain text where the frozen
    start model has them.

        L_retain = mean over retain positions t of (1/d)·‖h_ℓ,t(x_r) − h_ℓ,t^frozen(x_r)‖²,
        L = γ·L_forget + α·L_retain.

    Args:
        activations: ``(B, T, d)`` block-ℓ output of the trained model on the retain batch.
        frozen_activations: ``(B, T, d)`` the same of the frozen start model (detached here).
        mask, token_average: as in :func:`rmu_forget_loss`.
    """
    return activation_mse(activations, frozen_activations.detach(), mask, token_average)
