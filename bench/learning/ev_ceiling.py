"""How much of the return's variance can a critic explain at all? The EV ceilings of simple predictors.

From a saved SFT model (the recipe's ``sft.output_dir``, or ``--model``): K answers to each of N training prompts,
scored by the recipe's reward as a PPO step scores them, and the critic's targets as PPO takes them with λ_value = 1
and no KL (the Monte-Carlo return at every response token). Then ``EV = 1 − Var(R − V) / Var(R)`` over the response
tokens, overall and per position bucket, of predictors V a critic could at best approach: the mean return of the
samples of the same answer form (``form oracle``: a bare ``#### N`` or a worked answer, the first token's choice);
of the prompt's other samples (``prompt MC mean (leave-one-out)``; ``(in-sample)`` includes the sample: a bound);
of the prompt's other samples of the same form (``prompt x form``); with two difficulties, of the same difficulty
(``difficulty oracle``: known from the prompt) and of the same difficulty and form. ``--critic DIR`` (an exported
critic) adds that critic's own values on the same samples.

    python -m bench.learning.ev_ceiling recipes/tiny-math-cpu.yaml [key=value ...] [--prompts 64] [--samples 8]
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.common.paths import LEARNING
from bench.common.record import command_line, write_record
from dtppo import config as config_lib
from dtppo.algorithms.advantages import compute_gae, token_level_rewards
from dtppo.algorithms.losses import explained_var
from dtppo.data.chat import encode_prompts
from dtppo.data.loader import build_sources
from dtppo.generation.generator import TorchGenerator
from dtppo.generation.responses import decode_responses
from dtppo.generation.sampler import stream_key
from dtppo.launch.preflight import preflight
from dtppo.models.causal_lm import build_causal_lm, stop_token_ids
from dtppo.models.tokenizer import load_tokenizer
from dtppo.models.value import ValueModel
from dtppo.rewards.rewarder import Rewarder
from dtppo.types import SampleRequest, SamplingParams

POSITION_BUCKETS = [(0, 1), (1, 4), (4, 16), (16, 10_000)]


def group_mean(values: torch.Tensor, groups: torch.Tensor, leave_one_out: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values`` over each sample's group. values: [N] float; groups: [N] int64 group ids.

    Returns (means [N], has_others [N] bool). Leave-one-out excludes the sample itself; a sample alone in its
    group then has no mean (``has_others`` False, mean 0).
    """
    num_groups = int(groups.max()) + 1
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, groups, values.double())
    ones = torch.ones_like(values, dtype=torch.float64)
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, groups, ones)
    own_sum, own_count = sums[groups], counts[groups]
    if leave_one_out:
        own_sum, own_count = own_sum - values.double(), own_count - 1
    has_others = own_count > 0
    return torch.where(has_others, own_sum / own_count.clamp(min=1), 0.0), has_others


def predictors(
    rewards: torch.Tensor, prompt_ids: torch.Tensor, bare: torch.Tensor, hard: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """Per-sample predictions [N] of each predictor. rewards: [N]; prompt_ids: [N] int64; bare: [N] bool;
    hard: [N] bool, the problem's difficulty, or None for a task of one difficulty."""
    form = bare.long()
    prompt_loo, has_others = group_mean(rewards, prompt_ids, leave_one_out=True)
    joint_loo, has_joint = group_mean(rewards, prompt_ids * 2 + form, leave_one_out=True)
    by_difficulty = (
        {}
        if hard is None
        else {
            "difficulty oracle": group_mean(rewards, hard.long(), leave_one_out=False)[0],
            "difficulty x form": group_mean(rewards, hard.long() * 2 + form, leave_one_out=False)[0],
        }
    )
    return {
        "global mean": torch.full_like(rewards, rewards.double().mean().item(), dtype=torch.float64),
        "form oracle": group_mean(rewards, form, leave_one_out=False)[0],
        "prompt MC mean (leave-one-out)": torch.where(has_others, prompt_loo, rewards.double().mean()),
        "prompt MC mean (in-sample)": group_mean(rewards, prompt_ids, leave_one_out=False)[0],
        "prompt x form (leave-one-out)": torch.where(has_joint, joint_loo, prompt_loo),
        **by_difficulty,
    }


def position_masks(response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Response tokens by their index within the response. response_mask: [N, T] -> {bucket: [N, T]}."""
    index = response_mask.cumsum(-1) - 1
    return {
        f"positions {lo}-{hi - 1}" if hi < 10_000 else f"positions {lo}+": response_mask
        * ((index >= lo) & (index < hi)).float()
        for lo, hi in POSITION_BUCKETS
    }


def sample(cfg: config_lib.Config, model_dir: str, num_prompts: int, num_samples: int, seed: int, offset: int):
    tokenizer = load_tokenizer(model_dir)
    model = build_causal_lm(
        model_dir, cfg.policy.model.tiny, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed
    ).eval()
    source, _ = build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples, tokenizer=tokenizer)
    problems = [source[i] for i in range(offset, offset + num_prompts)]
    repeated = [p for p in problems for _ in range(num_samples)]
    prompts = encode_prompts(tokenizer, repeated, cfg.data)
    gen = cfg.policy.generation
    generator = TorchGenerator(model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id)
    params = SamplingParams(gen.max_new_tokens, gen.temperature, gen.top_p)
    experience = generator.sample(SampleRequest(prompts, params, stream_key(seed, 0), torch.arange(len(prompts))))
    texts = decode_responses(tokenizer, experience)
    rewarder = Rewarder(cfg.reward, cfg.data.system_prompt, "local", torch.device("cpu"))  # no Ray cluster here
    try:
        rewards = rewarder.score(repeated, texts).total
    finally:
        rewarder.close()
    prompt_ids = torch.arange(num_prompts).repeat_interleave(num_samples)
    bare = torch.tensor([t.strip().startswith("####") for t in texts])
    hard = (
        torch.tensor([is_hard(p.question, cfg.data.tiny_math.max_number) for p in repeated])
        if cfg.data.task == "tiny_math" and cfg.data.tiny_math.hard_fraction > 0
        else None
    )
    return experience, rewards, prompt_ids, bare, hard


def is_hard(question: str, max_number: int) -> bool:
    """Whether a tiny-math question is a hard one: it shows a number above the easy problems' ``max_number``."""
    return max(int(w.strip(".,")) for w in question.split() if w.strip(".,").isdigit()) > max_number


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--model", help="policy directory (default: the recipe's sft.output_dir)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--critic", help="an exported critic directory: its values become one more row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--offset", type=int, default=0, help="first training problem used (e.g. past those a PPO run trained on)"
    )
    parser.add_argument("--out", default=str(LEARNING / "ev_ceiling.json"))
    return parser.parse_args()


def explained_variances(cfg, critic: str | None, experience, rewards, prompt_ids, bare, hard) -> tuple[dict, dict]:
    """Each predictor's EV (and the critic's, when given) per position bucket; and the buckets' masks."""
    mask = experience.response_mask
    token_rewards = token_level_rewards(rewards, mask)
    _, returns = compute_gae(token_rewards, torch.zeros_like(mask), mask, cfg.ppo.gae.gamma, 1.0)
    buckets = {"all tokens": mask, **position_masks(mask)}
    rows = {
        name: per_sample.float()[:, None].expand_as(mask)
        for name, per_sample in predictors(rewards, prompt_ids, bare, hard).items()
    }
    if critic:
        with torch.no_grad():
            model = ValueModel.from_pretrained(critic, shift=cfg.value.shift_values).eval()
            rows[f"critic {critic}"] = model.values(experience.input_ids, experience.attention_mask)
    table = {name: {b: float(explained_var(returns, v, m)) for b, m in buckets.items()} for name, v in rows.items()}
    return table, buckets


def facts(args, model_dir: str, rewards, bare, hard, buckets: dict) -> dict:
    """What was sampled and how it scored: accuracy by answer form (and by difficulty), tokens per bucket."""
    mask = buckets["all tokens"]
    difficulty = (
        {}
        if hard is None
        else {
            "hard_fraction": float(hard.float().mean()),
            "accuracy_easy": float(rewards[~hard].mean()) if (~hard).any() else None,
            "accuracy_hard": float(rewards[hard].mean()) if hard.any() else None,
        }
    )
    return {
        "model": model_dir,
        "critic": args.critic,
        "prompts": args.prompts,
        "offset": args.offset,
        "samples_per_prompt": args.samples,
        "seed": args.seed,
        "accuracy": float(rewards.mean()),
        "bare_fraction": float(bare.float().mean()),
        "accuracy_bare": float(rewards[bare].mean()) if bare.any() else None,
        "accuracy_worked": float(rewards[~bare].mean()) if (~bare).any() else None,
        **difficulty,
        "token_fraction_per_bucket": {b: float(m.sum() / mask.sum()) for b, m in buckets.items()},
        "command": command_line(),
    }


def main() -> None:
    args = parse_args()
    cfg = config_lib.load(args.recipe, args.overrides)
    preflight(cfg)
    model_dir = args.model or cfg.sft.output_dir
    torch.manual_seed(args.seed)
    experience, rewards, prompt_ids, bare, hard = sample(
        cfg, model_dir, args.prompts, args.samples, args.seed, args.offset
    )
    table, buckets = explained_variances(cfg, args.critic, experience, rewards, prompt_ids, bare, hard)
    found = facts(args, model_dir, rewards, bare, hard, buckets)
    print(json.dumps(found, indent=1))
    print(f"\n{'predictor':<32}" + "".join(f"{b:>15}" for b in buckets))
    for name, row in table.items():
        print(f"{name:<32}" + "".join(f"{v:>15.3f}" for v in row.values()))
    write_record(args.out, {**found, "explained_variance": table}, found["command"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
