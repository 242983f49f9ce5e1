"""Supervised fine-tuning on (prompt, target) pairs: the checkpoint PPO starts from. The target is a task's worked
solution (GSM8K's answer, MATH's solution, tiny_math's), or a custom task's ``data.answer_key`` column.

SFT trains where the policy does: on the policy's ranks and device, laid out by ``policy.parallel`` (FSDP2, tensor
parallel), each rank on its share of every batch. Loss is the token-mean NLL of the target and EOS (prompt tokens
are not trained). An optional short "careless" stage afterwards mixes in bare wrong ``#### N`` answers: a planted
flaw that the tiny demo's PPO run must then remove (docs/guides/learning.md, "The demo").

The main stage can validate as it goes and stop at its plateau (``sft.val_period``, ``sft.patience``), so a recipe
trains its model to the same place on any CPU's kernels instead of stopping mid-climb, where small numeric
differences decide how far it got (docs/measurements/2026-12-01-critic-alignment-sft-models.md).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import time
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dtppo.config import TASK_VERIFIERS, Config, OptimizerConfig, SchedulerConfig
from dtppo.config import from_dict as config_from_dict
from dtppo.data.chat import ChatFormat, encode_prompts
from dtppo.data.loader import DatasetRows, PromptLoader, build_sources
from dtppo.data.problem import Problem
from dtppo.distributed.comm import barrier, broadcast_object, is_main_rank
from dtppo.distributed.context import ContextShards
from dtppo.envs.client import EnvClient
from dtppo.envs.transcripts import transcript_episodes
from dtppo.errors import BelowFloorError, InputError
from dtppo.files import replace_dir
from dtppo.generation.episodes import EpisodeGenerator
from dtppo.generation.generator import Generator, TorchGenerator
from dtppo.generation.responses import sample_responses
from dtppo.models.causal_lm import build_causal_lm, stop_token_ids
from dtppo.models.logprobs import sequence_logprobs
from dtppo.models.packing import needed_mask
from dtppo.models.tokenizer import load_tokenizer
from dtppo.models.weights import full_parameters, load_weights
from dtppo.observability.logger import MetricsLogger
from dtppo.observability.metrics import to_floats
from dtppo.ops import logprobs_from_logits, weighted_sum
from dtppo.rewards.functions import reward_function
from dtppo.types import Experience, build_episode_rows, build_response_mask
from dtppo.usercode.given import NOTHING_GIVEN, GivenInputs
from dtppo.workers.layout import RankLayout
from dtppo.workers.updater import Updater

RESULTS_FILE = "sft_results.json"


def sft_batch(tokenizer: PreTrainedTokenizerBase, problems, cfg: Config, env: EnvClient | None = None) -> Experience:
    """Right-padded ``[prompt | solution EOS | pad]`` rows with the solution as the response; with an environment,
    the solution is a transcript and only its assistant turns are the response (``envs.transcripts``)."""
    prompts = encode_prompts(tokenizer, problems, cfg.data)
    if env is not None:
        chat = ChatFormat.of(cfg.data)
        episodes = transcript_episodes(tokenizer, chat, env, cfg.env.stop, problems, list(range(len(problems))))
        return build_episode_rows(prompts, episodes, [0] * len(problems), tokenizer.pad_token_id)
    if any(not p.solution for p in problems):  # only a custom task's target column can be empty or not text
        raise InputError(
            f"data.answer_key: SFT trains on each row's target, and a row's {cfg.data.answer_key!r} holds no text "
            f"(a string or a number is needed)"
        )
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


def nll_loss_fn(model: nn.Module, cfg: Config, shards: ContextShards | None):
    """The response tokens' negative log-likelihood, a token mean over the batch (the updater's default weights).

    Scored as the policy's log-probs are (``models.logprobs``): no ``[B, T, V]`` logits, packed rows with
    ``policy.sequence_packing``, and with ``policy.parallel.cp`` > 1 each rank computes its tokens of every row, the
    log-probs gathered to the global row, so the cp ranks' summed gradients count every token once."""
    policy = cfg.policy

    def loss_fn(micro: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        wanted = micro.loss_weights != 0
        logprobs = sequence_logprobs(
            model, micro.input_ids, micro.attention_mask, wanted, 1.0, policy.logprob_chunk_size,
            policy.sequence_packing, shards,
        )  # fmt: skip
        return -weighted_sum(logprobs, micro.loss_weights), {}

    return loss_fn


class Plateau:
    """The main stage's stopping rule over its validation accuracies: ``sft.patience`` validations in a row that
    gain less than ``sft.min_improvement`` over the best so far, counted only once the best has reached the floor
    (``sft.min_accuracy``): a small model can sit for hundreds of steps at a low plateau (the answer's format
    learned, the arithmetic not yet) before it climbs, and that one is not the end. Patience 0 never stops."""

    def __init__(self, patience: int, min_improvement: float, floor: float):
        self.patience, self.min_improvement, self.floor = patience, min_improvement, floor
        self.best = -1.0
        self.stale = 0

    def judge(self, accuracy: float) -> None:
        if accuracy >= self.best + self.min_improvement:
            self.best, self.stale = accuracy, 0
        else:
            self.best = max(self.best, accuracy)
            self.stale = self.stale + 1 if self.best >= self.floor else 0

    @property
    def reached(self) -> bool:
        return self.patience > 0 and self.stale >= self.patience


def run_sft(cfg: Config, given: GivenInputs = NOTHING_GIVEN) -> dict[str, float]:
    """Train from ``policy.model`` (path or tiny config) and save an HF directory at ``sft.output_dir``, with its
    results in ``sft_results.json`` there. Every launched rank calls this: the model is laid out as the policy is
    (``policy.parallel``: FSDP2 and tensor parallel on the rank's device), each rank trains on its share of every
    batch, and rank 0 saves the gathered weights. The floor (``sft.min_accuracy``) is the caller's to check, after
    saving, so a model below it stays on disk to inspect."""
    sft = cfg.sft
    tokenizer = load_tokenizer(cfg.policy.model.path)
    torch.manual_seed(sft.seed)  # the same initial weights on every rank
    full = build_causal_lm(
        cfg.policy.model.path,
        cfg.policy.model.tiny,
        len(tokenizer),
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        sft.seed,
    )
    layout = RankLayout(cfg.policy.parallel)
    # Sharded, the whole weights exist only gathered: rank 0 saves them into a host copy of its own, and
    # validation samples a whole replica refitted before each validation. Unsharded, both use the model itself.
    host = copy.deepcopy(full) if layout.sharded and is_main_rank() else None
    whole = layout.replica(full) if layout.sharded else full
    model = layout.wrap(full, cfg.policy.activation_checkpointing, cfg.policy.cpu_offload)
    out_dir = Path(sft.output_dir)
    logger = MetricsLogger(
        out_dir.parent / f"{out_dir.name}_logs",
        sft.num_steps + sft.careless_stage.num_steps,
        cfg.logger.tensorboard,
        cfg.logger.progress,
        enabled=is_main_rank(),
    )
    start = time.perf_counter()
    rows = given.rows
    source, validation = build_sources(
        cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples, tokenizer=tokenizer, rows=rows
    )
    generator: Generator = TorchGenerator(
        whole, stop_token_ids(whole, tokenizer), tokenizer.pad_token_id, cfg.policy.generation.decoder
    )
    # Episodes with the environment that also splits the transcripts SFT trains on.
    env = EnvClient(cfg.env) if cfg.env.multi_turn else None
    if env is not None:
        generator = EpisodeGenerator(generator, env, tokenizer, cfg.env, ChatFormat.of(cfg.data))
    run = SFTRun(cfg, model, whole, layout, tokenizer, generator, validation, logger, env)
    try:
        results, step = run.stages(source, rows)
    finally:
        generator.close()
    results["sft/seconds"] = time.perf_counter() - start
    logger.log(step, results)
    logger.close()
    if layout.sharded:
        _gather_into(host, model, layout.device)
    if is_main_rank():
        _save_atomic(host if layout.sharded else model, tokenizer, out_dir, results)
    barrier()  # the directory is complete when any rank returns
    return results


class SFTRun:
    """One rank's SFT: the model as it trains (``model``, laid out by ``layout``), the whole model validation reads
    (``whole``: a refitted replica when sharded, else ``model`` itself), and the stages that train it."""

    def __init__(
        self,
        cfg: Config,
        model: nn.Module,
        whole: nn.Module,
        layout: RankLayout,
        tokenizer: PreTrainedTokenizerBase,
        generator: Generator,
        validation: list[Problem],
        logger: MetricsLogger,
        env: EnvClient | None,
    ):
        self.cfg, self.model, self.whole, self.layout = cfg, model, whole, layout
        self.tokenizer, self.generator, self.validation = tokenizer, generator, validation
        self.logger, self.env = logger, env
        self.by_accuracy = cfg.data.task != "custom"  # a custom task has no verifier to judge answers by

    def stages(self, source, rows: DatasetRows) -> tuple[dict[str, float], int]:
        """The main stage to its plateau on ``source``, then the careless stage (on ``rows`` where the training rows
        were given in Python): their results and the last step trained."""
        sft = self.cfg.sft
        plateau = Plateau(sft.patience, sft.min_improvement, sft.min_accuracy)
        updater = self.updater(sft.optimizer, sft.scheduler)
        loader = PromptLoader(source, sft.seed + 1)
        period = sft.val_period or max(sft.num_steps, 1)
        step, figures = self.train_stage(updater, loader, sft.num_steps, 0, period, plateau)
        figures = figures or self.validate(step)  # a main stage of 0 steps
        if self.by_accuracy:
            results = {"sft/accuracy": figures["sft/validation_accuracy"]}
        else:
            results = {"sft/validation_loss": figures["sft/validation_loss"]}
        results["sft/steps"] = float(step)
        careless = sft.careless_stage
        if careless.num_steps > 0:
            careless_source, _ = build_sources(
                self.cfg.data,
                self.cfg.ppo.seed,
                self.cfg.ppo.validation.max_samples,
                careless_fraction=careless.careless_fraction,
                rows=rows,
            )
            updater = self.updater(
                dataclasses.replace(sft.optimizer, lr=careless.lr), SchedulerConfig(total_steps=careless.num_steps)
            )
            loader = PromptLoader(careless_source, sft.seed + 2)
            step, _ = self.train_stage(updater, loader, careless.num_steps, step, None, None)
            results["sft/accuracy_after_careless_stage"] = self.validate(step)["sft/validation_accuracy"]
        return results, step

    def train_stage(
        self,
        updater: Updater,
        loader: PromptLoader,
        num_steps: int,
        first_step: int,
        period: int | None,
        plateau: Plateau | None,
    ) -> tuple[int, dict[str, float]]:
        """Train up to ``num_steps`` steps; with a validation ``period``, validate every ``period`` steps and at the
        stage's end, and stop at the ``plateau``'s. Returns the last step trained and its last validation's
        figures (empty without validation)."""
        sft = self.cfg.sft
        loss_fn = nll_loss_fn(self.model, self.cfg, self.layout.shards)
        micro = sft.micro_batch_size or sft.batch_size  # the updater takes at most a rank's share at once
        step, figures = first_step, {}
        for i in range(num_steps):
            batch = sft_batch(self.tokenizer, loader.next_batch(sft.batch_size), self.cfg, self.env)
            metrics = {
                f"sft/{k}": v for k, v in to_floats(updater.train(batch, loss_fn, sft.batch_size, micro)).items()
            }
            step = first_step + i + 1
            last = i == num_steps - 1
            validated = period is not None and (last or step % period == 0)
            if validated:
                figures = self.validate(step)
                metrics |= figures
                if plateau is not None and self.by_accuracy:
                    plateau.judge(figures["sft/validation_accuracy"])
                    last = last or plateau.reached
            if step % sft.log_period == 0 or last or validated:
                self.logger.log(step, metrics)
            if last:
                break
        return step, figures

    def updater(self, optim: OptimizerConfig, schedule: SchedulerConfig) -> Updater:
        """AdamW over the model; each rank takes its share of a batch's rows, gradients summed over the ranks."""
        unsharded = self.cfg.policy.parallel.unsharded_grad_accumulation
        return self.layout.updater(
            self.model, optim, schedule, self.cfg.sft.max_grad_norm, name="sft", unsharded_accumulation=unsharded
        )

    def validate(self, step: int) -> dict[str, float]:
        """``sft/validation_accuracy`` (greedy answers judged by the task's verifier) or, for a custom task,
        ``sft/validation_loss`` (the validation targets' token-mean NLL): rank 0's figure on every rank, so that
        all ranks take the same stopping decision."""
        self.generator.refit(self.model, step)  # collective when sharded
        if self.by_accuracy:
            figures = {
                "sft/validation_accuracy": verifier_accuracy(
                    self.generator, self.tokenizer, self.validation, self.cfg, step
                )
            }
        else:
            figures = {"sft/validation_loss": self.target_loss()}
        return broadcast_object(figures, src=0)

    @torch.no_grad()
    def target_loss(self) -> float:
        """Token-mean NLL of the validation rows' targets (and EOS) under the whole model, in batches of
        ``ppo.validation.batch_size``."""
        total, tokens = 0.0, 0.0
        device = next(self.whole.parameters()).device
        self.whole.eval()
        for start in range(0, len(self.validation), self.cfg.ppo.validation.batch_size):
            problems = self.validation[start : start + self.cfg.ppo.validation.batch_size]
            rows = sft_batch(self.tokenizer, problems, self.cfg, self.env).to(device)
            logits = self.whole(input_ids=rows.input_ids, attention_mask=needed_mask(rows.attention_mask)).logits
            logprobs = logprobs_from_logits(logits.float(), rows.input_ids)
            total -= float((logprobs * rows.response_mask).sum())
            tokens += float(rows.response_mask.sum())
        return total / tokens


def verifier_accuracy(
    generator: Generator, tokenizer: PreTrainedTokenizerBase, problems: list[Problem], cfg: Config, step: int
) -> float:
    """The mean score of the task's verifier over the generator's answers to ``problems`` (``policy.generation``'s
    validation sampling), scored in this process: SFT's tasks all have a verifier."""
    generator.prepare()
    responses = sample_responses(
        generator, tokenizer, problems, cfg.policy.generation, cfg.ppo.validation, cfg.data, cfg.ppo.seed, step
    )
    generator.finish()
    name = TASK_VERIFIERS[cfg.data.task]
    scores = reward_function(name)(
        prompts=[p.question for p in problems], completions=responses.texts, answer=[p.answer for p in problems]
    )
    return float(torch.tensor(scores, dtype=torch.float32).mean())


def _gather_into(host: PreTrainedModel | None, model: nn.Module, device: torch.device) -> None:
    """The sharded ``model``'s whole weights into ``host`` (rank 0's copy; None on the other ranks, which only
    take part in the gathers)."""
    weights = full_parameters(model, device)
    if host is None:
        for _ in weights:
            pass
    else:
        load_weights(host, ((name, tensor.cpu()) for name, tensor in weights))


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
    replace_dir(tmp, out_dir)


def sft_is_done(cfg: Config) -> bool:
    return (Path(cfg.sft.output_dir) / "config.json").is_file()


def sft_rank(tree: dict, given: GivenInputs = NOTHING_GIVEN) -> None:
    """One rank of SFT (the config as a plain tree: what a launcher hands a rank; ``given``: rows passed in Python)."""
    run_sft(config_from_dict(tree), given)
