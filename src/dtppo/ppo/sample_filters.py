"""The samples of a step that train, and how much each token counts: the rollout-correction phase.

Two sample filters, applied after the reward (whose failed chunks already left training, ``sample_mask``): DAPO's
overlong filtering (Yu et al. 2025, §3.4: truncated samples leave training, ``ppo.overlong_filtering``) and the
mismatch mask (samples whose generator and trainer probabilities disagree,
``loss.rollout_correction.seq_logprob_error_threshold``); then truncated importance weights for the tokens that
train (``loss.rollout_correction.importance_sampling``). DAPO's overlong shaping, a reward term, is computed here
too, the one place truncation is judged.
"""

from __future__ import annotations

import torch

from dtppo.algorithms.mismatch import mismatch_sample_mask, rollout_is_weights, seq_mult_prob_error
from dtppo.algorithms.shaping import overlong_penalty
from dtppo.config import Config
from dtppo.errors import RunStopped
from dtppo.types import Experience


def overlong_penalties(experience: Experience, cfg: Config) -> torch.Tensor:
    """[B] DAPO's soft overlong penalty of each sample (``ppo.overlong_shaping``; 0 when off)."""
    shaping = cfg.ppo.overlong_shaping
    if not shaping.enabled:
        return torch.zeros(experience.batch_size)
    lengths = experience.response_mask.sum(-1)
    return overlong_penalty(lengths, cfg.policy.generation.max_new_tokens, shaping.buffer, shaping.factor)


def filter_samples(experience: Experience, cfg: Config) -> Experience:
    """The step's rows with the samples that leave training marked in ``sample_mask`` (besides those whose reward
    failed) and, with ``loss.rollout_correction.importance_sampling``, the trained tokens' importance weights
    (``is_weights``). Raises RunStopped when no sample is left."""
    if cfg.ppo.overlong_filtering:
        experience = drop_truncated(experience)
    if cfg.loss.rollout_correction.seq_logprob_error_threshold is not None:
        experience = drop_mismatched(experience, cfg.loss.rollout_correction.seq_logprob_error_threshold)
    if cfg.loss.rollout_correction.importance_sampling is not None:
        weights = rollout_is_weights(
            experience.old_logprobs,
            experience.gen_logprobs,
            experience.train_mask,
            cfg.loss.rollout_correction.importance_sampling,
            cfg.loss.rollout_correction.importance_sampling_cap,
        )
        experience = experience.replace(is_weights=weights)
    return experience


def drop_truncated(experience: Experience) -> Experience:
    """DAPO's overlong filtering: truncated samples leave training."""
    complete = (~experience.truncated).float()
    scored = experience.sample_mask
    experience = experience.replace(sample_mask=complete if scored is None else complete * scored)
    if not experience.sample_mask.any():
        raise RunStopped(
            "every scored sample of the step was truncated and ppo.overlong_filtering leaves them all out: "
            "nothing is left to train on (raise policy.generation.max_new_tokens)"
        )
    return experience


def drop_mismatched(experience: Experience, threshold: float) -> Experience:
    """Samples whose sequence-level probability error (generator against trainer) exceeds ``threshold`` leave
    training."""
    error = seq_mult_prob_error(experience.gen_logprobs, experience.old_logprobs, experience.response_mask)
    mismatch = mismatch_sample_mask(error, threshold)
    kept = mismatch if experience.sample_mask is None else mismatch * experience.sample_mask
    experience = experience.replace(sample_mask=kept)
    if not experience.sample_mask.any():
        raise RunStopped(
            "every sample's probability error exceeds "
            f"loss.rollout_correction.seq_logprob_error_threshold = {threshold} "
            f"(smallest {float(error.min()):.4g}): the generator's log-probs do not match the policy's "
            f"(stale or wrong weights in the generator?); nothing is left to train on"
        )
    return experience
