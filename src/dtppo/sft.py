"""Supervised fine-tuning on (prompt, worked solution) pairs: the checkpoint PPO starts from.

Loss is the token-mean NLL of the solution and EOS (prompt tokens are not trained). An optional short
"careless" stage afterwards mixes in bare wrong ``#### N`` answers: a planted flaw that the tiny demo's PPO
run must then remove (see README, "What the demo shows").

The main stage can validate as it goes and stop at its plateau (``sft.val_period``, ``sft.patience``), so a recipe
trains its model to the same place on any CPU's kernels instead of stopping mid-climb, where small numeric
differences decide how far it got (docs/learning.md, "Issue 19").
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dtppo.config import Config, SchedulerConfig
from dtppo.data.loader import PromptLoader, build_sources, encode_prompts
from dtppo.envs.client import EnvClient
from dtppo.envs.transcripts import transcript_episodes
from dtppo.evaluation import evaluate
from dtppo.faults import BelowFloorError, InputError
from dtppo.logging import MetricsLogger
from dtppo.metrics import to_floats
from dtppo.models.causal_lm import build_causal_lm, stop_token_ids
from dtppo.models.tokenizer import load_tokenizer
from dtppo.ops import logprobs_from_logits, weighted_sum
from dtppo.rollout.episodes import EpisodeGenerator
from dtppo.rollout.generator import Generator, TorchGenerator
from dtppo.types import Experience, build_episode_rows, build_response_mask
from dtppo.workers.engine import TrainEngine

RESULTS_FILE = "sft_results.json"


def sft_batch(tokenizer: PreTrainedTokenizerBase, problems, cfg: Config, env: EnvClient | None = None) -> Experience:
    """Right-padded ``[prompt | solution EOS | pad]`` rows with the solution as the response; with an environment,
    the solution is a transcript and only its assistant turns are the response (``envs.transcripts``)."""
    prompts = encode_prompts(tokenizer, problems, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
    if env is not None:
        episodes = transcript_episodes(tokenizer, env, cfg.env.stop, problems, list(range(len(problems))))
        return build_episode_rows(prompts, episodes, [0] * len(problems), tokenizer.pad_token_id)
    answers = tokenizer([p.solution for p in problems], add_special_tokens=False)["input_ids"]
    rows = [p + a + [tokenizer.eos_token_id] for p, a in zip(prompts, answers)]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
    prompt_lengths = torch.tensor([len(p) for p in prompts])
    total = torch.tensor([len(r) for r in rows])
    response_mask = build_response_mask(prompt_lengths, total - prompt_lengths, width)
    attention_mask = (torch.arange(width)[None] < total[:, None]).long()
    zeros = torch.zeros(input_ids.shape)
    return Experience(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        gen_logprobs=zeros,
        truncated=torch.zeros(len(rows), dtype=torch.bool),
    )


def nll_loss_fn(model: PreTrainedModel):
    """The response tokens' negative log-likelihood, a token mean over the batch (the engine's default weights)."""

    def loss_fn(micro: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
        logprobs = logprobs_from_logits(logits, micro.input_ids)
        return -weighted_sum(logprobs, micro.loss_weights), {}

    return loss_fn


def _train_stage(
    model,
    tokenizer,
    cfg: Config,
    engine: TrainEngine,
    loader: PromptLoader,
    num_steps: int,
    logger: MetricsLogger,
    first_step: int,
    plateau: Plateau | None = None,
    env: EnvClient | None = None,
) -> int:
    """Train up to ``num_steps`` steps; with a ``plateau``, validate every ``sft.val_period`` steps and stop at
    its plateau. Returns the last step trained."""
    loss_fn = nll_loss_fn(model)
    step = first_step
    for i in range(num_steps):
        batch = sft_batch(tokenizer, loader.next_batch(cfg.sft.batch_size), cfg, env)
        trained = to_floats(engine.train(batch, loss_fn, cfg.sft.batch_size, cfg.sft.batch_size))
        metrics = {f"sft/{k}": v for k, v in trained.items()}
        step = first_step + i + 1
        last = i == num_steps - 1
        validated = plateau is not None and (last or step % plateau.period == 0)
        if validated:
            metrics["sft/validation_accuracy"] = plateau.validate(step)
            last = last or plateau.reached
        if step % cfg.sft.log_period == 0 or last or validated:
            logger.log(step, metrics)
        if last:
            break
    return step


class Plateau:
    """Greedy validation during the main stage and its stopping rule: ``sft.patience`` validations in a row that
    gain less than ``sft.min_improvement`` over the best so far, counted only once the best has reached the floor
    (``sft.min_accuracy``): a small model can sit for hundreds of steps at a low plateau (the answer's format
    learned, the arithmetic not yet) before it climbs, and that one is not the end. Patience 0 never stops."""

    def __init__(self, evaluate_at, period: int, patience: int, min_improvement: float, floor: float):
        self.evaluate_at, self.period, self.patience = evaluate_at, period, patience
        self.min_improvement, self.floor = min_improvement, floor
        self.best = -1.0
        self.stale = 0
        self.last_accuracy = None

    def validate(self, step: int) -> float:
        accuracy = self.evaluate_at(step)
        self.last_accuracy = accuracy
        if accuracy >= self.best + self.min_improvement:
            self.best, self.stale = accuracy, 0
        else:
            self.best = max(self.best, accuracy)
            self.stale = self.stale + 1 if self.best >= self.floor else 0
        return accuracy

    @property
    def reached(self) -> bool:
        return self.patience > 0 and self.stale >= self.patience


def run_sft(cfg: Config) -> dict[str, float]:
    """Train from ``policy.model`` (path or tiny config) and save an HF directory at ``sft.output_dir``, with its
    results in ``sft_results.json`` there. The floor (``sft.min_accuracy``) is checked after saving, so a model
    below it stays on disk to inspect."""
    sft = cfg.sft
    if cfg.data.task == "custom":
        raise InputError("data.task: SFT trains on worked solutions, which data.task custom does not have")
    tokenizer = load_tokenizer(cfg.policy.model.path)
    torch.manual_seed(sft.seed)
    model = build_causal_lm(
        cfg.policy.model.path,
        cfg.policy.model.tiny,
        len(tokenizer),
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        sft.seed,
    )
    out_dir = Path(sft.output_dir)
    logger = MetricsLogger(
        out_dir.parent / f"{out_dir.name}_logs",
        sft.num_steps + sft.careless_stage.num_steps,
        cfg.logger.tensorboard,
        cfg.logger.progress,
    )
    start = time.perf_counter()
    source, validation = build_sources(cfg, tokenizer=tokenizer)
    # Validation samples the model being trained (no copy), with the recipe's torch decoder; episodes with the
    # environment that also splits the transcripts SFT trains on.
    generator: Generator = TorchGenerator(
        model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id, cfg.policy.generation.decoder
    )
    env = EnvClient(cfg.env) if cfg.env.multi_turn else None
    if env is not None:
        generator = EpisodeGenerator(generator, env, tokenizer, cfg.env)
    try:
        results, step = _run_stages(cfg, model, tokenizer, generator, source, validation, logger, env)
    finally:
        generator.close()
    results["sft/seconds"] = time.perf_counter() - start
    logger.log(step, results)
    logger.close()
    _save_atomic(model, tokenizer, out_dir, results)
    return results


def _run_stages(
    cfg: Config, model, tokenizer, generator: Generator, source, validation, logger, env: EnvClient | None
) -> tuple[dict[str, float], int]:
    """The main stage to its plateau, then the careless stage: their results and the last step trained."""
    sft = cfg.sft
    plateau = Plateau(
        lambda step: evaluate(generator, tokenizer, validation, cfg, step).accuracy,
        sft.val_period or max(sft.num_steps, 1),
        sft.patience,
        sft.min_improvement,
        sft.min_accuracy,
    )
    engine = TrainEngine(model, sft.optimizer, sft.scheduler, sft.max_grad_norm)
    step = _train_stage(
        model, tokenizer, cfg, engine, PromptLoader(source, sft.seed + 1), sft.num_steps, logger, 0, plateau, env
    )
    if plateau.last_accuracy is None:  # a main stage of 0 steps
        plateau.validate(step)
    results = {"sft/accuracy": plateau.last_accuracy, "sft/steps": float(step)}
    careless = sft.careless_stage
    if careless.num_steps > 0:
        careless_source, _ = build_sources(cfg, careless_fraction=careless.careless_fraction)
        optim = dataclasses.replace(sft.optimizer, lr=careless.lr)
        engine = TrainEngine(model, optim, SchedulerConfig(total_steps=careless.num_steps), sft.max_grad_norm)
        loader = PromptLoader(careless_source, sft.seed + 2)
        step = _train_stage(model, tokenizer, cfg, engine, loader, careless.num_steps, logger, step, env=env)
        results["sft/accuracy_after_careless_stage"] = evaluate(generator, tokenizer, validation, cfg, step).accuracy
    return results, step


def check_floor(results: dict[str, float], cfg: Config) -> None:
    """Stop (``BelowFloorError``, one line) when the SFT model's main-stage accuracy is below ``sft.min_accuracy``."""
    accuracy, floor = results.get("sft/accuracy"), cfg.sft.min_accuracy
    if accuracy is not None and accuracy < floor:
        steps = results.get("sft/steps")
        trained = f" after {int(steps)} steps" if steps is not None else ""
        raise BelowFloorError(
            f"sft.min_accuracy: the SFT model at {cfg.sft.output_dir} reached {100 * accuracy:.1f} % greedy validation "
            f"accuracy{trained}, below this recipe's floor of {100 * floor:.1f} %: PPO would not start from the model "
            f"the recipe was measured with (train longer with sft.num_steps, or set sft.min_accuracy lower to go on)"
        )


def saved_results(cfg: Config) -> dict[str, float]:
    """The results ``run_sft`` saved with the model at ``sft.output_dir``; empty for a directory made elsewhere."""
    path = Path(cfg.sft.output_dir) / RESULTS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"sft.output_dir: {path} is unreadable ({err}): delete it or the SFT directory") from None
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise InputError(f"sft.output_dir: {path} is not a JSON object of numbers")
    return {str(k): float(v) for k, v in data.items()}


def _save_atomic(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path, results: dict[str, float]
) -> None:
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / RESULTS_FILE).write_text(json.dumps(results, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def sft_is_done(cfg: Config) -> bool:
    return (Path(cfg.sft.output_dir) / "config.json").is_file()
