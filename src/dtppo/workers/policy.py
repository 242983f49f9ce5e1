"""PolicyWorker: generates rollouts, recomputes log-probs, and trains the actor with the clipped PPO loss."""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedTokenizerBase

from dtppo.algorithms.losses import policy_loss
from dtppo.config import Config
from dtppo.data.chat import ChatFormat
from dtppo.distributed.comm import is_main_rank
from dtppo.faults import gen_logprob_error
from dtppo.generation.episodes import with_episodes
from dtppo.generation.generator import Generator, build_generator
from dtppo.models.causal_lm import build_policy, stop_token_ids
from dtppo.models.logprobs import sequence_logprobs
from dtppo.models.lora import adapters_disabled, add_adapters, merged_model
from dtppo.models.lora import describe as describe_lora
from dtppo.models.weights import full_parameters
from dtppo.types import Experience, SampleRequest
from dtppo.workers.base import Worker
from dtppo.workers.layout import RankLayout


class PolicyWorker(Worker):
    """Owns the policy model, its optimizer and (when KL is used) a frozen reference copy; with LoRA
    (``policy.lora``) the reference is the policy with its adapters off, and there is no copy.

    Log-probs are taken under ``softmax(logits / temperature)``, the distribution generation samples from,
    so ``train/token_mult_prob_error`` measures only numerical drift; only response tokens' (the rest is 0).
    """

    def __init__(self, cfg: Config, tokenizer: PreTrainedTokenizerBase, layout: RankLayout | None = None):
        torch.manual_seed(cfg.ppo.seed)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.temperature = cfg.policy.generation.temperature
        self.layout = layout or RankLayout(cfg.policy.parallel)
        full = build_policy(cfg.policy_init_path, cfg.policy.model.tiny, cfg.ppo.seed, tokenizer)
        self._check_context("policy", full.config)
        # Copies are taken on the CPU, before the policy is wrapped: one device copy each.
        section = cfg.policy
        if section.lora.enabled:
            add_adapters(full, section.lora, cfg.ppo.seed)
            if is_main_rank():
                print(f"policy: {describe_lora(full, section.lora)}", flush=True)
        # With generation ranks the policy is sampled there (rollout.remote), from weights this worker sends.
        self.generator: Generator | None = None
        if cfg.cluster.generation_ranks == 0:
            # A generator samples plain weights, adapters merged in (its static decoder reads weight tensors, not
            # modules): with adapters, a merged copy of its own, refitted after each update as a replica is.
            generator = build_generator(
                section.generation,
                merged_model(full),
                stop_token_ids(full, tokenizer),
                tokenizer.pad_token_id,
                max_prompt_tokens=cfg.generation_prompt_tokens,
                seed=cfg.ppo.seed,
                device=self.layout.device,
                replica=self.layout.replica if self.layout.sharded else None,
            )
            self.generator = with_episodes(generator, cfg.env, ChatFormat.of(cfg.data), tokenizer)
            if is_main_rank():
                print(f"generation: {self.generator.describe()}", flush=True)
        self.reference = None
        if cfg.loss.kl.coef > 0.0 and not section.lora.enabled:
            # Offloaded with the policy when it is: a frozen model's parameters are all the memory it has.
            self.reference = self.layout.wrap(
                copy.deepcopy(full).eval().requires_grad_(False), cpu_offload=section.cpu_offload
            )
        self.model = self.layout.wrap(full, section.activation_checkpointing, section.cpu_offload)
        self.updater = self._build_updater(section)
        if section.sequence_packing:  # after the updater, as the value worker's check
            self._check_packing("policy.sequence_packing", "log-probs", full.config, self._probe_logprobs)

    # ---- generation (``rollout.generator``: the sampler, its decoder and its copy of the weights live behind it)
    def prepare_for_generation(self) -> None:
        self.generator.prepare()

    def finish_generation(self) -> None:
        self.generator.finish()

    def refit(self, version: int) -> None:
        """Give the generator the weights just trained, policy version ``version`` (collective when sharded);
        nothing when it holds that version already."""
        if self.generator.version != version:
            self.generator.refit(self.model, version)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole policy's weights under their plain HF names, adapters merged, on every policy rank (collective
        when sharded): what generation ranks get (``models.weights``)."""
        return dict(full_parameters(self.model, self.layout.device))

    def close(self) -> None:
        self.generator.close()

    def generate(self, request: SampleRequest) -> Experience:
        """Each dp rank samples its block of the request's prompts; every rank returns the whole batch."""
        part = self.generator.sample(request.take(self.layout.my_rows(len(request))))
        experience = self.layout.gather_experience(part, self.tokenizer.pad_token_id)
        error = gen_logprob_error(experience.batch_size)
        if error is not None:  # test hook (dtppo.faults): a generator whose log-probs are off on purpose
            shifted = experience.gen_logprobs - error[:, None] * experience.response_mask
            experience = experience.replace(gen_logprobs=shifted)
        return experience

    # ---- inference
    @torch.no_grad()
    def get_logprobs(self, experience: Experience) -> torch.Tensor:
        """log π(x_t | x_<t) of the current policy. Returns [B, T] float32, 0 at t=0 and on padding."""
        return self._logprobs(self.model, experience)

    @torch.no_grad()
    def get_reference_logprobs(self, experience: Experience) -> torch.Tensor:
        """Log-probs of the frozen reference policy (with LoRA: the policy, adapters off). Returns [B, T] float32."""
        assert self.cfg.loss.kl.coef > 0.0, "reference log-probs need loss.kl.coef > 0"
        if self.cfg.policy.lora.enabled:
            with adapters_disabled(self.model):
                return self._logprobs(self.model, experience)
        return self._logprobs(self.reference, experience)

    def _logprobs(self, model: torch.nn.Module, experience: Experience) -> torch.Tensor:
        return self.layout.map_rows(
            experience, lambda rows: self._token_logprobs(model, rows), self.cfg.policy.logprob_batch_size
        )

    def _token_logprobs(self, model: torch.nn.Module, rows: Experience) -> torch.Tensor:
        """log π(x_t | x_<t) under ``model`` of each response token of ``rows``; 0 elsewhere. -> [B, T] float32.

        Only response tokens reach the LM head, ``policy.logprob_chunk_size`` at a time (``models.logprobs``).
        With ``policy.sequence_packing`` the rows' sequences are packed (no pad tokens computed) and the
        results unpacked; with ``policy.parallel.cp`` > 1 each rank computes its tokens of every row.
        """
        policy = self.cfg.policy
        return sequence_logprobs(
            model,
            rows.input_ids,
            rows.attention_mask,
            rows.response_mask.bool(),
            self.temperature,
            policy.logprob_chunk_size,
            policy.sequence_packing,
            self.layout.shards,
        )

    def _probe_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: bool) -> torch.Tensor:
        """Every token's log-prob under the policy, rows packed or padded (the packing check). [B, T] -> [B, T]."""
        chunk = self.cfg.policy.logprob_chunk_size
        return sequence_logprobs(
            self.model, input_ids, attention_mask, attention_mask.bool(), self.temperature, chunk, packing,
            self.layout.shards,
        )  # fmt: skip

    # ---- training
    def loss(self, micro: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped PPO loss of one microbatch (its share of the minibatch's aggregated loss, with grad) and its
        statistics."""
        loss_cfg = self.cfg.loss
        logprobs = self._token_logprobs(self.model, micro)
        return policy_loss(
            logprobs,
            micro.old_logprobs,
            micro.advantages,
            micro.train_mask,
            loss_cfg.ratio_clip_low,
            loss_cfg.ratio_clip_high,
            loss_cfg.ratio_clip_c,
            micro.ref_logprobs,
            0.0 if loss_cfg.kl.in_reward else loss_cfg.kl.coef,
            loss_cfg.kl.estimator,
            gen_logprobs=micro.gen_logprobs,
            is_weights=micro.is_weights,
            weights=micro.loss_weights,
        )

    def train(self, experience: Experience) -> dict[str, torch.Tensor]:
        """One epoch of clipped PPO over ``experience`` (needs old_logprobs and advantages)."""
        section = self.cfg.policy
        return self.updater.train(
            experience,
            self.loss,
            section.train_global_batch_size,
            section.train_micro_batch_size,
            section.max_tokens_per_microbatch,
        )
