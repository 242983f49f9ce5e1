"""Where each step's rollouts come from, chosen once (``build_rollouts``): the policy's own ranks, right before the
step trains on them (``LocalRollouts``), or the generation ranks, up to ``ppo.max_lag`` steps ahead
(``RemoteRollouts``, docs/guides/async.md).

Both draw each step's prompts from the prompt loader once, in step order (``PromptQueue``), and sample step j's
with the stream key of step j, so the tokens of a batch depend on the step and the policy's weights only. With
generation ranks, batch j is sampled by the policy of version ``max(j − max_lag, 0)`` (version v: the weights
after v steps), exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from dtppo.config import Config
from dtppo.data.chat import encode_prompts
from dtppo.data.loader import PromptLoader
from dtppo.data.problem import Problem
from dtppo.distributed.comm import broadcast_object, is_main_rank
from dtppo.envs.interface import episode_row
from dtppo.errors import CheckpointError, GenerationError, InputError
from dtppo.generation.remote import GenerationClient, RemoteBatch, connect_client, flatten_weights
from dtppo.generation.responses import Responses, sample_responses
from dtppo.generation.sampler import stream_key
from dtppo.models.weights import weight_names
from dtppo.types import ROLLOUT_FIELDS, Experience, SampleRequest, SamplingParams
from dtppo.workers.role import PolicyRole


@dataclass(frozen=True)
class Rollout:
    """One step's samples: the problems (each repeated ``num_generations_per_prompt`` times), their rows, how many
    steps older the sampling policy is than the one about to train, and the generation side's figures
    (``timing/*``, ``perf/*``; empty when the policy's own ranks sampled them)."""

    problems: list[Problem]
    experience: Experience
    staleness: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class ScoredBatch:
    """The batch a step trains on, after its reward and the critic's values (``rollout``), the reward parts' means
    (rank 0; empty elsewhere) and dynamic sampling's counts (``train/dynamic_sampling/*``; empty without it)."""

    rollout: Rollout
    reward_means: dict[str, float]
    selection: dict[str, float]


class PromptQueue:
    """Each step's prompt batch, drawn once and in step order, possibly ahead of the step that trains on it. The
    loader's position before each batch drawn ahead is kept: a checkpoint records where step N's draw begins."""

    def __init__(self, cfg: Config, tokenizer: PreTrainedTokenizerBase, loader: PromptLoader):
        self.cfg, self.tokenizer, self.loader = cfg, tokenizer, loader
        self.batches: dict[int, tuple[list[Problem], list[list[int]]]] = {}
        self.positions: dict[int, dict[str, int]] = {}
        self.next_step = 0  # the next batch to draw
        self.step = 0  # the next step to train

    def draw_through(self, step: int) -> tuple[list[Problem], list[list[int]]]:
        """Draw every batch up to ``step``'s; return step's (problems, prompt token ids)."""
        while self.next_step <= step:
            self.positions[self.next_step] = self.loader.state_dict()
            self.batches[self.next_step] = self.draw_extra()
            self.next_step += 1
        return self.batches[step]

    def draw_extra(self) -> tuple[list[Problem], list[list[int]]]:
        """The next batch from where the loader stands, (problems, prompt token ids), recorded nowhere: a step's own
        (``draw_through``) or one more for the step being trained (dynamic sampling)."""
        cfg = self.cfg
        problems = self.loader.next_batch(cfg.ppo.num_prompts_per_step)
        problems = [p for p in problems for _ in range(cfg.ppo.num_generations_per_prompt)]
        return problems, encode_prompts(self.tokenizer, problems, cfg.data)

    def pop(self, step: int) -> tuple[list[Problem], list[list[int]]]:
        """Step's batch (drawing it if needed), forgotten here: the step is training on it."""
        batch = self.draw_through(step)
        del self.batches[step], self.positions[step]
        self.step = step + 1
        return batch

    def position(self, step: int) -> dict[str, int]:
        """The loader's position before step's batch (drawn or not yet)."""
        return self.positions[step] if step in self.positions else self.loader.state_dict()

    def state_dict(self) -> dict:
        """Where the next step to train draws its batch from: the loader's position before it, and its number."""
        return {"loader": self.position(self.step), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint: the loader at its position, the next batch drawn being its step's."""
        self.loader.load_state_dict(state["loader"])
        self.batches, self.positions = {}, {}
        self.next_step = self.step = int(state["step"])


def rollout_request(
    cfg: Config, step: int, prompts: list[list[int]], rows: list[dict] | None = None, extra: int = 0
) -> SampleRequest:
    """Step ``step``'s request to sample ``prompts`` at ``policy.generation``'s settings: its stream key, and sample
    ids past those of the step's ``extra`` earlier batches (dynamic sampling's), so no two samples share random
    numbers."""
    gen = cfg.policy.generation
    params = SamplingParams(gen.max_new_tokens, gen.temperature, gen.top_p, False, gen.min_new_tokens)
    sample_ids = torch.arange(len(prompts)) + extra * len(prompts)
    return SampleRequest(prompts, params, stream_key(cfg.ppo.seed, step), sample_ids, rows)


class LocalRollouts:
    """Synchronous: each step's batch is sampled by the policy's own ranks right before the step trains on it, and
    the generator is refitted after every policy update."""

    def __init__(self, cfg: Config, policy: PolicyRole, prompts: PromptQueue):
        self.cfg, self.policy, self.prompts = cfg, policy, prompts

    def start(self, steps_done: int) -> None:
        """Before the first step (fresh or resumed): the generator holds the policy's current weights."""
        self.policy.refit(steps_done)

    def submit(self, step: int) -> None:
        self.prompts.draw_through(step)

    def take(self, step: int) -> Rollout:
        return self._sample(step, *self.prompts.pop(step), extra=0)

    def take_extra(self, step: int, extra: int) -> Rollout:
        """Dynamic sampling's ``extra``-th additional batch for ``step`` (1, 2, ...): fresh prompts from the loader,
        sampled with the step's stream key and sample ids past the earlier batches', so no two samples share
        random numbers."""
        return self._sample(step, *self.prompts.draw_extra(), extra=extra)

    def _sample(self, step: int, problems: list[Problem], prompts: list[list[int]], extra: int) -> Rollout:
        request = rollout_request(self.cfg, step, prompts, [episode_row(p) for p in problems], extra)
        with self.policy.generation():
            experience = self.policy.generate(request)
        return Rollout(problems, experience, 0, {})

    def publish(self, version: int, updated: bool) -> None:
        """After a step: the generator samples the next one from the updated policy."""
        if updated:
            self.policy.refit(version)

    def validation(self, problems: list[Problem], step: int) -> Responses:
        with self.policy.generation():
            return self.policy.sample_validation(problems, step)

    def state_dict(self) -> dict:
        """Where the next step draws its batch (``PromptQueue.state_dict``)."""
        return self.prompts.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Resume before the checkpoint's next step. Batches an asynchronous run had in flight are not used: this
        run samples those steps again, from the current policy (``dtppo eval`` resumes any checkpoint so)."""
        if state.get("in_flight") and is_main_rank():
            print(
                f"the checkpoint holds {len(state['in_flight'])} batch(es) sampled ahead with ppo.max_lag="
                f"{state['max_lag']}; without generation ranks they are sampled again",
                flush=True,
            )
        self.prompts.load_state_dict(state)

    def close(self) -> None:
        self.policy.close()


class RemoteRollouts:
    """The generation ranks sample; training rank 0 talks to them (``rollout.remote.GenerationClient``) and shares
    each batch with the other training ranks.

    Per step i: ``submit`` requests every batch up to i + lag (each from the version it must be sampled with),
    ``take`` waits for batch i, ``publish`` sends the weights the step produced (all of it posted without
    waiting: the trainer stops only for the collective that gathers the weights). ``state_dict`` collects the
    batches in flight: a checkpoint holds them, so a resumed run trains on exactly what the uninterrupted one did.
    """

    def __init__(self, cfg: Config, policy: PolicyRole, prompts: PromptQueue):
        self.cfg, self.policy, self.prompts = cfg, policy, prompts
        self.lag, self.last_step = cfg.ppo.max_lag, cfg.ppo.max_num_steps - 1
        self.submitted = -1
        self.client: GenerationClient | None = None
        if is_main_rank():  # rank 0 is always a policy rank
            self.names = weight_names(policy.worker.model)
            self.client = connect_client(cfg.cluster)
            print(f"generation: {self.client.description}, running up to {self.lag} step(s) ahead", flush=True)

    def version_for(self, step: int) -> int:
        """The policy version that samples ``step``'s batch."""
        return max(step - self.lag, 0)

    def start(self, steps_done: int) -> None:
        """The generation ranks get the current weights (version ``steps_done``)."""
        self.publish(steps_done, updated=True)
        self.submitted = max(self.submitted, steps_done - 1)

    def submit(self, step: int) -> None:
        for j in range(self.submitted + 1, min(step + self.lag, self.last_step) + 1):
            _, prompts = self.prompts.draw_through(j)
            if self.client is not None:
                self.client.submit(j, rollout_request(self.cfg, j, prompts), self.version_for(j))
            self.submitted = j

    def take(self, step: int) -> Rollout:
        problems, _ = self.prompts.pop(step)
        shared = None
        if self.client is not None:
            batch, waited = self.client.collect(step)
            shared = (batch.experience, batch.version, _generation_metrics(batch, waited))
        experience, version, metrics = broadcast_object(shared, src=0)
        if version != self.version_for(step):
            raise GenerationError(
                f"batch {step} was sampled by policy version {version}, not {self.version_for(step)} "
                f"(ppo.max_lag={self.lag})"
            )
        return Rollout(problems, experience, step - version, metrics)

    def publish(self, version: int, updated: bool) -> None:
        """Policy version ``version`` to the generation ranks: its weights when ``updated`` (a collective over the
        policy's ranks gathers them), else only the new number."""
        state = self.policy.full_state_dict() if updated else None
        if self.client is not None:
            self.client.publish(flatten_weights(state, self.names) if updated else None, version)

    def validation(self, problems: list[Problem], step: int) -> Responses | None:
        """Answers from the generation ranks, with the current policy (after every batch requested before);
        on rank 0, None elsewhere."""
        if self.client is None:
            return None
        cfg = self.cfg
        return sample_responses(
            self.client,
            self.prompts.tokenizer,
            problems,
            cfg.policy.generation,
            cfg.ppo.validation,
            cfg.data,
            cfg.ppo.seed,
            step,
        )

    def state_dict(self) -> dict:
        """Where the next step draws its batch (``PromptQueue.state_dict``) and, on rank 0, every batch in flight
        (received first), with the lag they were sampled for."""
        state = self.prompts.state_dict() | {"max_lag": self.lag}
        if self.client is not None:
            self.client.collect_all()
            state["in_flight"] = {str(j): _batch_state(b) for j, b in sorted(self.client.received.items())}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume: the loader before the checkpoint's next step, and the batches that were in flight, their
        prompts drawn again (and checked against the stored rows)."""
        written = int(state.get("max_lag", 0))
        if written != self.lag:
            raise InputError(
                f"ppo.max_lag: the checkpoint was written with ppo.max_lag={written} (its batches in flight were "
                f"sampled for that lag); resume it with the same value, not {self.lag}"
            )
        self.prompts.load_state_dict(state)
        for tag, stored in sorted(state.get("in_flight", {}).items(), key=lambda item: int(item[0])):
            step = int(tag)
            _, prompts = self.prompts.draw_through(step)
            batch = _batch_from_state(stored)
            _check_prompts(step, batch.experience, prompts)
            if self.client is not None:
                self.client.received[step] = batch
            self.submitted = step

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def build_rollouts(
    cfg: Config, policy: PolicyRole, tokenizer: PreTrainedTokenizerBase, loader: PromptLoader
) -> LocalRollouts | RemoteRollouts:
    """Generation ranks (``cluster.generation_ranks``) sample when there are any; the policy's ranks otherwise."""
    prompts = PromptQueue(cfg, tokenizer, loader)
    if cfg.cluster.generation_ranks > 0:
        return RemoteRollouts(cfg, policy, prompts)
    return LocalRollouts(cfg, policy, prompts)


def _generation_metrics(batch: RemoteBatch, waited: float) -> dict[str, float]:
    """How the batch's time went: the trainer's wait for it, the generation ranks' wait for the trainer, their
    sampling and weight-loading time, and the share of their time spent sampling."""
    return {
        "timing/generation_wait": waited,
        "timing/train_wait": batch.waited,
        "timing/generation_busy": batch.busy,
        "timing/generation_weight_load": batch.loading,
        "perf/generation_busy_fraction": batch.busy / max(batch.cycle, 1e-9),
    }


def _batch_state(batch: RemoteBatch) -> dict:
    """A batch as tensors and plain numbers (what ``trainer.pt`` may hold)."""
    fields = {name: getattr(batch.experience, name) for name in ROLLOUT_FIELDS}
    fields = {name: x for name, x in fields.items() if x is not None}
    times = {"busy": batch.busy, "waited": batch.waited, "loading": batch.loading, "cycle": batch.cycle}
    return fields | {"version": batch.version, "times": times}


def _batch_from_state(state: dict) -> RemoteBatch:
    experience = Experience(**{name: state[name] for name in ROLLOUT_FIELDS if name in state})
    times = state["times"]
    return RemoteBatch(
        experience, int(state["version"]), times["busy"], times["waited"], times["loading"], times["cycle"]
    )


def _check_prompts(step: int, experience: Experience, prompts: list[list[int]]) -> None:
    """The stored rows of ``step`` begin with the prompts the loader draws for it again."""
    prompt_lengths = (experience.attention_mask - experience.response_mask.long()).sum(-1)
    stored = [row[:n].tolist() for row, n in zip(experience.input_ids, prompt_lengths.tolist())]
    if stored != prompts:
        raise CheckpointError(
            f"the checkpoint's batch in flight for step {step} does not hold the prompts the loader draws for that "
            f"step: the data or the recipe changed since it was written"
        )
