"""Supervised fine-tuning on (prompt, worked solution) pairs: the checkpoint PPO starts from.

Loss is the token-mean NLL of the solution and EOS (prompt tokens are not trained). An optional short
"careless" stage afterwards mixes in bare wrong ``#### N`` answers: a planted flaw that the tiny demo's PPO
run must then remove (see README, "What the demo shows").
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dtppo.config import Config, SchedulerConfig
from dtppo.data.loader import PromptLoader, build_sources, encode_prompts
from dtppo.evaluation import evaluate, model_sampler
from dtppo.logging import MetricsLogger
from dtppo.metrics import to_floats
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.tokenizer import load_tokenizer
from dtppo.ops import logprobs_from_logits, masked_sum
from dtppo.types import Experience, build_response_mask
from dtppo.workers.engine import TrainEngine


def sft_batch(tokenizer: PreTrainedTokenizerBase, problems, cfg: Config) -> Experience:
    """Right-padded ``[prompt | solution EOS | pad]`` rows with the solution as the response."""
    prompts = encode_prompts(tokenizer, problems, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
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
    return Experience(input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask,
                      gen_logprobs=zeros, truncated=torch.zeros(len(rows), dtype=torch.bool))


def nll_loss_fn(model: PreTrainedModel):
    def loss_fn(micro: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
        logprobs = logprobs_from_logits(logits, micro.input_ids)
        return -masked_sum(logprobs, micro.response_mask), {}

    return loss_fn


def _train_stage(model, tokenizer, cfg: Config, engine: TrainEngine, loader: PromptLoader, num_steps: int,
                 logger: MetricsLogger, first_step: int) -> int:
    loss_fn = nll_loss_fn(model)
    for i in range(num_steps):
        batch = sft_batch(tokenizer, loader.next_batch(cfg.sft.batch_size), cfg)
        metrics = engine.train(batch, loss_fn, cfg.sft.batch_size, cfg.sft.batch_size)
        step = first_step + i + 1
        if step % cfg.sft.log_period == 0 or i == num_steps - 1:
            logger.log(step, {f"sft/{k}": v for k, v in to_floats(metrics).items()})
    return first_step + num_steps


def run_sft(cfg: Config) -> dict[str, float]:
    """Train from ``policy.model`` (path or tiny config) and save an HF directory at ``sft.output_dir``."""
    sft = cfg.sft
    tokenizer = load_tokenizer(cfg.policy.model.path)
    torch.manual_seed(cfg.ppo.seed)
    model = build_causal_lm(cfg.policy.model.path, cfg.policy.model.tiny, len(tokenizer), tokenizer.pad_token_id,
                            tokenizer.eos_token_id, cfg.ppo.seed)
    out_dir = Path(sft.output_dir)
    logger = MetricsLogger(out_dir.parent / f"{out_dir.name}_logs", sft.num_steps + sft.careless_stage.num_steps,
                           cfg.logger.tensorboard, cfg.logger.progress)
    start = time.perf_counter()
    source, validation = build_sources(cfg, tokenizer=tokenizer)
    engine = TrainEngine(model, sft.optimizer, sft.scheduler, sft.max_grad_norm)
    step = _train_stage(model, tokenizer, cfg, engine, PromptLoader(source, cfg.ppo.seed + 1), sft.num_steps,
                        logger, 0)
    sample = model_sampler(model, tokenizer)
    results = {"sft/accuracy": evaluate(sample, tokenizer, validation, cfg, step).accuracy}
    careless = sft.careless_stage
    if careless.num_steps > 0:
        careless_source, _ = build_sources(cfg, careless_fraction=careless.careless_fraction)
        optim = dataclasses.replace(sft.optimizer, lr=careless.lr)
        engine = TrainEngine(model, optim, SchedulerConfig(total_steps=careless.num_steps), sft.max_grad_norm)
        step = _train_stage(model, tokenizer, cfg, engine, PromptLoader(careless_source, cfg.ppo.seed + 2),
                            careless.num_steps, logger, step)
        results["sft/accuracy_after_careless_stage"] = evaluate(sample, tokenizer, validation, cfg, step).accuracy
    results["sft/seconds"] = time.perf_counter() - start
    logger.log(step, results)
    logger.close()
    _save_atomic(model, tokenizer, out_dir)
    return results


def _save_atomic(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def sft_is_done(cfg: Config) -> bool:
    return (Path(cfg.sft.output_dir) / "config.json").is_file()
