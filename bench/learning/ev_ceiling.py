"""How much of the return's variance can a critic explain at all? EV ceilings of simple predictors (issue 12, item 1).

From a saved SFT model: sample K answers to each of N training prompts (the recipe's sampling settings), score
them with the recipe's reward as a PPO step does (``Rewarder``), and take the critic's targets as PPO does with
λ_value = 1 and no KL: the discounted Monte-Carlo return at every response token (with γ = 1, the sample's
reward). Then the explained variance
``EV = 1 − Var(R − V) / Var(R)`` over all response tokens (as ``train/critic/explained_var``) of predictors V
that a critic could at best approach:

- ``form oracle``: the mean return of samples with the same answer form (a bare ``#### N`` vs a worked answer),
  known from the first response token on (the form is the first token's choice);
- ``prompt MC mean (leave-one-out)``: the mean return of the prompt's other K − 1 samples, i.e. an estimate of
  V(prompt) that does not see the sample it predicts; ``(in-sample)`` includes it (biased upward; a bound);
- ``prompt x form (leave-one-out)``: the mean of the prompt's other samples of the same form (the prompt mean
  when there is none);
- ``difficulty oracle`` (only with ``data.tiny_math.hard_fraction > 0``): the mean return of samples whose
  problem has the same difficulty (a hard problem shows a number above ``data.tiny_math.max_number``), known
  from the prompt;
- ``difficulty x form``: the mean return of samples of the same difficulty and form.

Each EV is also given per response-position bucket, to show where the explainable variance lies.
``--critic DIR`` (a critic written by ``dtppo export``) adds that critic's own values V(s_t) on the same
samples as a row, so a trained critic can be set against the ceilings on identical data.

    python -m bench.learning.ev_ceiling recipes/tiny-math-cpu.yaml [key=value ...] [--prompts 64] [--samples 8]

Uses the recipe's ``sft.output_dir`` (``--model`` to choose another, e.g. an exported policy). Writes
bench/results/learning/ev_ceiling.json.
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
from dtppo.data.loader import build_sources, encode_prompts
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
    source, _ = build_sources(cfg, tokenizer=tokenizer)
    problems = [source[i] for i in range(offset, offset + num_prompts)]
    repeated = [p for p in problems for _ in range(num_samples)]
    prompts = encode_prompts(tokenizer, repeated, cfg.data)
    gen = cfg.policy.generation
    generator = TorchGenerator(model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id)
    experience = generator.sample(
        SampleRequest(
            prompts,
            SamplingParams(gen.max_new_tokens, gen.temperature, gen.top_p),
            stream_key(seed, 0),
            torch.arange(len(prompts)),
        )
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--model", help="policy directory (default: the recipe's sft.output_dir)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--critic", help="an exported critic directory: its values become one more row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--offset",
        type=int,
        default=0,
        help="first training problem used (e.g. past those a PPO run trained its critic on)",
    )
    parser.add_argument("--out", default=str(LEARNING / "ev_ceiling.json"))
    args = parser.parse_args()
    cfg = config_lib.load(args.recipe, args.overrides)
    preflight(cfg)
    model_dir = args.model or cfg.sft.output_dir
    torch.manual_seed(args.seed)
    experience, rewards, prompt_ids, bare, hard = sample(
        cfg, model_dir, args.prompts, args.samples, args.seed, args.offset
    )
    mask = experience.response_mask
    token_rewards = token_level_rewards(rewards, mask)
    _, returns = compute_gae(token_rewards, torch.zeros_like(mask), mask, cfg.ppo.gamma, 1.0)
    buckets = {"all tokens": mask, **position_masks(mask)}
    table = {}
    for name, per_sample in predictors(rewards, prompt_ids, bare, hard).items():
        values = per_sample.float()[:, None].expand_as(mask)
        table[name] = {bucket: float(explained_var(returns, values, m)) for bucket, m in buckets.items()}
    if args.critic:
        with torch.no_grad():
            values = (
                ValueModel.from_pretrained(args.critic, shift=cfg.value.shift_values)
                .eval()
                .values(experience.input_ids, experience.attention_mask)
            )
        table[f"critic {args.critic}"] = {
            bucket: float(explained_var(returns, values, m)) for bucket, m in buckets.items()
        }
    facts = {
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
        **(
            {}
            if hard is None
            else {
                "hard_fraction": float(hard.float().mean()),
                "accuracy_easy": float(rewards[~hard].mean()) if (~hard).any() else None,
                "accuracy_hard": float(rewards[hard].mean()) if hard.any() else None,
            }
        ),
        "token_fraction_per_bucket": {b: float(m.sum() / mask.sum()) for b, m in buckets.items()},
        "command": command_line(),
    }
    print(json.dumps(facts, indent=1))
    print(f"\n{'predictor':<32}" + "".join(f"{b:>15}" for b in buckets))
    for name, row in table.items():
        print(f"{name:<32}" + "".join(f"{v:>15.3f}" for v in row.values()))
    write_record(args.out, {**facts, "explained_variance": table}, facts["command"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
