"""Value alignment, token-level rewards, GAE, its off-policy form V-trace, and advantage whitening.

Conventions: ``values[b, t] = V(s_t)``, the value of the state *before* token t is emitted; the
sequence reward lands on the last response token; masked positions inside a row are skipped as if absent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dtppo.ops import masked_whiten, shift_right


@dataclass(frozen=True)
class VTraceCorrection:
    """What ``compute_vtrace`` needs beyond GAE's inputs: log_rho [B, T] = log π − log μ per token, and the caps."""

    log_rho: torch.Tensor
    rho_cap: float
    c_cap: float


def right_shift_values(values: torch.Tensor, sequence_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Align value-head outputs to states: ``out[:, t] = values[:, t-1]``, ``out[:, 0] = 0``.

    values: [B, T] or [B, T, 1] head outputs (position t has seen tokens 0..t) -> same shape, V(s_t).
    Without this shift the "value" of token t would already have seen token t, the action it judges.
    sequence_starts: [B, T] bool for packed rows: the shift restarts at each sequence's first token, so
    V(s_t) of one sequence is never read from the previous sequence's last position.
    """
    return shift_right(values, sequence_starts)


def last_response_index(response_mask: torch.Tensor) -> torch.Tensor:
    """[B] int64: the position of each row's last response token (0 for a row without one). response_mask: [B, T]."""
    positions = torch.arange(response_mask.shape[1], device=response_mask.device)[None, :]
    return (positions * response_mask.long()).argmax(dim=1)


def token_level_rewards(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Sequence reward on the last response token, optional ``-kl_coef * kl`` on every response token.

    rewards: [B] float32; response_mask: [B, T]; kl: [B, T] per-token KL estimate or None -> [B, T] float32,
    zero on masked positions. A row with no response tokens gets no reward.
    """
    last = last_response_index(response_mask)
    has_response = response_mask.sum(dim=1) > 0
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    out[torch.arange(out.shape[0]), last] = torch.where(has_response, rewards.float(), 0.0)
    if kl is not None and kl_coef > 0.0:
        out = out - kl_coef * torch.where(response_mask.bool(), kl, torch.zeros_like(kl))
    return out


def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) with carry-forward masking.

    token_rewards: [B, T]; values: [B, T] V(s_t); mask: [B, T] valid (response) positions;
    lam: float or [B] per-sample λ. Returns (advantages [B, T], returns [B, T]), unwhitened, 0 where masked:

        δ_t = r_t + γ·V_{t+1} − V_t,   A_t = δ_t + γ·λ·A_{t+1},   returns_t = A_t + V_t,

    where V_{t+1} and A_{t+1} are the next valid token's (masked positions leave the running state untouched) and
    the last valid token does not bootstrap. It is ``compute_vtrace`` with every ratio 1 (the tokens sampled by the
    policy being trained), which takes exactly these products in this order.
    """
    return compute_vtrace(token_rewards, values, torch.zeros_like(values), mask, gamma, lam)


def compute_vtrace(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    log_rho: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float | torch.Tensor,
    rho_cap: float = 1.0,
    c_cap: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace (Espeholt et al. 2018, eq. 1, with the λ of their Remark 2 in the traces): GAE for tokens sampled
    from a behaviour policy μ while the targets are for the policy π being trained.

    token_rewards: [B, T]; values: [B, T] V(s_t); log_rho: [B, T] per-token log π(x_t) − log μ(x_t) (any value off
    the mask); mask: [B, T] valid (response) positions; lam: float or [B] per-sample λ; rho_cap ρ̄ and c_cap c̄
    bound the ratios. Returns (advantages [B, T], returns [B, T]), unwhitened, 0 where masked, from

        A_t = ρ_t·(r_t + γ·V_{t+1} − V_t) + γ·c_t·A_{t+1},
        ρ_t = min(ρ̄, e^{log_rho_t}),  c_t = λ·min(c̄, e^{log_rho_t}),  returns_t = A_t + V_t (the target v_t).

    Masking and bootstrapping are ``compute_gae``'s: the next valid token's V and A carry across masked positions
    and the last valid token does not bootstrap. With log_rho = 0 (and caps >= 1) every number equals
    ``compute_gae``'s exactly: ρ_t = 1, c_t = λ, and the products are taken in the same order.
    """
    batch, seq_len = values.shape
    lam_b = torch.as_tensor(lam, dtype=torch.float32, device=values.device).expand(batch)
    valid = mask.bool()
    ratio = torch.exp(torch.where(valid, log_rho.float(), 0.0))
    rho = torch.clamp(ratio, max=rho_cap)
    c = lam_b[:, None] * torch.clamp(ratio, max=c_cap)
    next_value = torch.zeros(batch, dtype=torch.float32, device=values.device)
    last_adv = torch.zeros_like(next_value)
    advantages = torch.zeros(batch, seq_len, dtype=torch.float32, device=values.device)
    # The trace of the next valid token: c at token t multiplies A_{t+1}, so it is read from t, not carried.
    for t in reversed(range(seq_len)):
        v_t = torch.where(valid[:, t], values[:, t].float(), 0.0)
        delta = token_rewards[:, t] + gamma * next_value - v_t
        adv = rho[:, t] * delta + gamma * c[:, t] * last_adv
        next_value = torch.where(valid[:, t], v_t, next_value)
        last_adv = torch.where(valid[:, t], adv, last_adv)
        advantages[:, t] = last_adv
    advantages = torch.where(valid, advantages, 0.0)
    returns = torch.where(valid, advantages + values.float(), 0.0)
    return advantages, returns


def turn_starts(mask: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the first action token of each turn. mask: [B, T] action tokens; turn_ids: [B, T] int64 (a
    turn's action tokens are contiguous: its observation follows them)."""
    valid = mask.bool()
    prev_valid = torch.cat([torch.zeros_like(valid[:, :1]), valid[:, :-1]], dim=1)
    prev_turn = torch.cat([torch.zeros_like(turn_ids[:, :1]), turn_ids[:, :-1]], dim=1)
    return valid & ~(prev_valid & (prev_turn == turn_ids))


def compute_turn_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_ids: torch.Tensor,
    gamma: float,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE with one step per assistant turn (AReaL's ``gae_timestep_unit: turn``): a turn's state is the one before
    its first token, its value V there, its reward the sum of its tokens' rewards; each turn's advantage and return
    go to every one of its action tokens.

    token_rewards, values: [B, T]; mask: [B, T] action tokens; turn_ids: [B, T] the 1-based turn of each token (0
    off the episode). Returns (advantages, returns) [B, T], 0 where masked. γ and λ apply per turn."""
    valid = mask.bool()
    starts = turn_starts(mask, turn_ids)
    turns = int(turn_ids.max()) + 1 if turn_ids.numel() else 1
    # Each turn's reward summed over its action tokens, then placed on its first one.
    per_turn = torch.zeros(turn_ids.shape[0], turns, dtype=torch.float32, device=values.device)
    per_turn.scatter_add_(1, turn_ids, torch.where(valid, token_rewards.float(), 0.0))
    at_start = torch.where(starts, per_turn.gather(1, turn_ids), 0.0)
    advantages, returns = compute_gae(at_start, values, starts.float(), gamma, lam)
    # Each token takes its turn's figures, read at the turn's first token.
    start_of = torch.zeros_like(per_turn).scatter_(1, turn_ids * starts, torch.where(starts, advantages, 0.0))
    return_of = torch.zeros_like(per_turn).scatter_(1, turn_ids * starts, torch.where(starts, returns, 0.0))
    return (
        torch.where(valid, start_of.gather(1, turn_ids), 0.0),
        torch.where(valid, return_of.gather(1, turn_ids), 0.0),
    )


def outcome_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """The sequence reward discounted back to each valid token: γ^(n−1−i)·r at the i-th of a row's n valid tokens
    (masked positions skipped), the Monte-Carlo return the sampled response got. A yardstick for the critic that
    does not depend on its targets (GAE's λ, V-trace's corrections, the KL in the reward).

    rewards: [B]; mask: [B, T] -> [B, T] float32, 0 where masked."""
    values = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return compute_gae(token_level_rewards(rewards, mask), values, mask, gamma, 1.0)[1]


def length_adaptive_lambda(response_lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """VAPO's λ = 1 − 1/(α·len), per sample, clamped to [0, 1]. response_lengths: [B] -> [B] float32."""
    return (1.0 - 1.0 / (alpha * response_lengths.float().clamp(min=1))).clamp(0.0, 1.0)


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean 0 / unbiased std 1 (``rsqrt(σ² + 1e-8)``, so no signal gives ≈ 0); masked positions 0.

    x, mask: [B, T].
    """
    return masked_whiten(x, mask)


def compute_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lambda_policy: float | torch.Tensor,
    lambda_value: float | torch.Tensor,
    normalize: bool,
    vtrace: VTraceCorrection | None = None,
    turn_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled GAE: advantages from ``lambda_policy``, returns from ``lambda_value``; one pass when equal.
    With ``vtrace``, both passes are ``compute_vtrace``'s instead; with ``turn_ids`` [B, T], ``compute_turn_gae``'s
    (one step per turn).

    All tensors [B, T]; λs float or [B]. Returns (advantages, returns); advantages whitened when normalize.
    """

    def estimate(lam: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if turn_ids is not None:
            return compute_turn_gae(token_rewards, values, mask, turn_ids, gamma, lam)
        if vtrace is None:
            return compute_gae(token_rewards, values, mask, gamma, lam)
        return compute_vtrace(token_rewards, values, vtrace.log_rho, mask, gamma, lam, vtrace.rho_cap, vtrace.c_cap)

    advantages, returns = estimate(lambda_policy)
    same_lambda = isinstance(lambda_policy, float) and isinstance(lambda_value, float) and lambda_policy == lambda_value
    if not same_lambda:
        _, returns = estimate(lambda_value)
    if normalize:
        advantages = whiten(advantages, mask)
    return advantages, returns


# TRL's GRPOTrainer adds 1e-4 to the group std; DeepSeekMath states no epsilon.
GRPO_STD_EPS = 1e-4


def group_normalized_advantages(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_size: int,
    eps: float = GRPO_STD_EPS,
    sample_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath §4.1.2): ``A_i = (r_i − mean(r)) / (std(r) + eps)``.

    rewards: [B] float32, B = num_prompts · group_size, rows ``g·G … g·G + G − 1`` are one prompt's samples
    (the trainer repeats each prompt consecutively); response_mask: [B, T] -> [B, T] float32, ``A_i`` on every
    response token of sample i, 0 elsewhere. sample_mask: [B], 0 for samples left out of training: mean and
    std are then over each group's remaining samples (a group with one left has std 0 and gets 0).
    Conventions (the paper states neither; TRL's GRPOTrainer): std is the unbiased (Bessel) estimate over the
    group, eps = 1e-4 is added to it, and no whitening over the step follows. A group whose rewards are all
    equal has zero numerator and gets 0: it carries no learning signal.
    """
    grouped = rewards.float().reshape(-1, group_size)
    keep = torch.ones_like(grouped) if sample_mask is None else sample_mask.float().reshape(-1, group_size)
    count = keep.sum(dim=1, keepdim=True)
    mean = (grouped * keep).sum(dim=1, keepdim=True) / count.clamp(min=1)
    std = (((grouped - mean) ** 2 * keep).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    per_sample = ((grouped - mean) / (std + eps) * keep).reshape(-1)
    return torch.where(response_mask.bool(), per_sample[:, None], 0.0)


def process_supervised_advantages(
    rewards: torch.Tensor,
    step_rewards: torch.Tensor,
    step_mask: torch.Tensor,
    response_mask: torch.Tensor,
    group_size: int,
    eps: float = GRPO_STD_EPS,
    sample_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO with process supervision (Shao et al. 2024, DeepSeekMath §4.1.3): every step reward of a group's samples
    normalised by the mean and std of all that group's step rewards, ``r̃ = (r − mean(R)) / (std(R) + eps)``, and each
    token's advantage the sum of the normalised rewards of its sample's steps that end at or after it.

    rewards: [B] the outcome, a step ending at each sample's last response token; step_rewards: [B, T] the other
    steps' rewards on the tokens where they end, which step_mask: [B, T] marks (rewards on one token are one step);
    response_mask: [B, T]; rows as in ``group_normalized_advantages``, whose conventions (Bessel std, eps, groups
    of ``group_size`` adjacent rows, sample_mask) hold here too -> [B, T] float32, 0 off the response. With no
    step anywhere it is ``group_normalized_advantages`` exactly: one step per sample, the outcome.
    """
    valid = response_mask.bool()
    marked = step_mask.bool() & valid
    values = torch.where(marked, step_rewards.float(), 0.0) + token_level_rewards(rewards, response_mask)
    steps = marked.clone()
    steps[torch.arange(len(rewards)), last_response_index(response_mask)] |= valid.any(dim=1)
    keep = steps if sample_mask is None else steps & sample_mask.bool()[:, None]
    width = values.shape[1]
    grouped, kept = values.reshape(-1, group_size * width), keep.reshape(-1, group_size * width).float()
    count = kept.sum(dim=1, keepdim=True)
    mean = (grouped * kept).sum(dim=1, keepdim=True) / count.clamp(min=1)
    std = (((grouped - mean) ** 2 * kept).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    normalised = ((grouped - mean) / (std + eps) * kept).reshape(values.shape)
    to_go = normalised.flip(1).cumsum(1).flip(1)  # the sum over the steps ending at or after each token
    return torch.where(valid, to_go, 0.0)


def first_token_abs_mean(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean |A| at each sample's first response token (the decision token), over samples with a response.

    advantages: [B, T]; response_mask: [B, T] -> scalar float32 (0 when no sample has a response token).
    Unshifted values see the token they judge, so their advantage here is pushed toward 0 (docs/guides/learning.md).
    """
    valid = response_mask.bool()
    has_response = valid.any(dim=1)
    first = valid.float().argmax(dim=1)  # index of the first True; 0 for an empty row, masked below
    at_first = advantages.float().gather(1, first[:, None]).squeeze(1).abs()
    return torch.where(has_response, at_first, 0.0).sum() / has_response.sum().clamp(min=1)
