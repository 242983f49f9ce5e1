"""The rules of a Config that span sections, checked once by ``load`` and ``from_dict`` (each section checks its own
fields when it is built, ``schema``); each failure names its dotted key."""

from __future__ import annotations

import sys
from typing import Literal

from dtppo.config.models import TinyModelConfig
from dtppo.config.reward_spec import BUILTINS, parse_spec
from dtppo.config.rules import require
from dtppo.config.schema import Config


def check(cfg: Config) -> None:
    """Every rule below; a GRPO run has no critic, so the value section's batches and layout are not checked."""
    _check_grpo(cfg)
    _check_async(cfg)
    _check_env(cfg)
    _check_sample_selection(cfg)
    _check_critic_start(cfg)
    if cfg.policy.generation.backend == "vllm":
        _check_vllm(cfg)
    for section in ("policy", "value") if cfg.has_critic else ("policy",):
        _check_layout(cfg, section)
        _check_batches(cfg, section)
        _check_lora(cfg, section)
    _check_tiny_tensor_parallel(cfg)
    _check_reward(cfg)


def check_sft(cfg: Config) -> None:
    """What SFT needs of a recipe, checked before it runs (``dtppo sft``, and ``dtppo ppo`` when ppo.init_from_sft
    finds no SFT model), not for a PPO run that reuses one: a target column to train on, and a batch that splits
    evenly over the policy's data-parallel ranks, where SFT trains."""
    if cfg.data.task == "custom":
        require(
            cfg.data.answer_key is not None,
            "data.answer_key",
            "SFT trains on a target column, and data.task custom names none: set data.answer_key to the column "
            "holding each prompt's completion (or set ppo.init_from_sft=false and start from policy.model.path)",
        )
        require(
            cfg.sft.patience == 0 and cfg.sft.min_accuracy == 0.0,
            "sft.patience",
            "sft.patience and sft.min_accuracy judge greedy accuracy, which needs a task's verifier; data.task custom "
            "has none (its SFT validates by the targets' loss): set both to 0",
        )
    dp = cfg.data_parallel_size("policy")
    require(
        cfg.sft.batch_size % dp == 0,
        "sft.batch_size",
        f"{cfg.sft.batch_size} must divide evenly over the policy's {dp} data-parallel ranks (SFT trains where the "
        f"policy does: its pool's ranks / (policy.parallel.tp · policy.parallel.cp))",
    )
    micro = cfg.sft.micro_batch_size
    require(
        micro is None or (cfg.sft.batch_size // dp) % micro == 0,
        "sft.micro_batch_size",
        f"{micro} must divide the per-rank share of sft.batch_size = {cfg.sft.batch_size // dp}",
    )


def _check_reward(cfg: Config) -> None:
    """What ``Config`` fills in from data.task: one weight per function, an accuracy source that is scored (the
    functions themselves are ``RewardConfig``'s; that there is something to reward is ``launch.preflight``'s, as
    functions may be given in Python)."""
    reward = cfg.reward
    names = [parse_spec(spec).name for spec in reward.functions]
    require(
        len(reward.weights) == len(reward.functions),
        "reward.weights",
        f"needs one weight per reward function ({len(reward.functions)}), got {len(reward.weights)}",
    )
    builtin = reward.accuracy_from is not None and reward.accuracy_from in BUILTINS
    require(
        reward.accuracy_from is None or builtin or reward.accuracy_from in names,
        "reward.accuracy_from",
        f"{reward.accuracy_from!r} is neither a built-in verifier nor one of reward.functions {names}",
    )


def _check_grpo(cfg: Config) -> None:
    """GRPO's baseline is the group: one sample per prompt has none, and there is no critic to place or warm up."""
    if cfg.has_critic:
        return
    require(
        cfg.ppo.num_generations_per_prompt >= 2,
        "ppo.num_generations_per_prompt",
        f"must be >= 2 with ppo.advantage_estimator=grpo (the group is the baseline), "
        f"got {cfg.ppo.num_generations_per_prompt}",
    )
    require(
        cfg.value.warmup.steps == 0,
        "value.warmup.steps",
        "must be 0 with ppo.advantage_estimator=grpo (it is a critic warmup; grpo has no critic)",
    )
    require(
        cfg.cluster.colocated,
        "cluster.policy_ranks",
        "must be 0 with ppo.advantage_estimator=grpo (there is no critic pool to give ranks to)",
    )
    require(
        not (cfg.loss.kl.coef > 0.0 and cfg.loss.kl.in_reward),
        "loss.kl.in_reward",
        "must be false with ppo.advantage_estimator=grpo (its advantages use the outcome reward only; "
        "the KL goes in the loss, as in DeepSeekMath)",
    )


def _check_async(cfg: Config) -> None:
    """Running ahead needs ranks to run on and a loss that knows the tokens came from an older policy; V-trace
    corrects a critic's targets, so it needs one."""
    lag = cfg.ppo.max_lag
    require(
        lag == 0 or cfg.cluster.generation_ranks >= 1,
        "ppo.max_lag",
        f"{lag} needs cluster.generation_ranks >= 1: generation runs ahead only on ranks of its own (with "
        f"generation on the training ranks, each step waits for its own rollouts)",
    )
    require(
        lag == 0 or cfg.loss.rollout_correction.importance_sampling is not None,
        "loss.rollout_correction.importance_sampling",
        f"must be token or sequence with ppo.max_lag={lag}: the tokens come from a policy up to {lag} steps older "
        f"than the one the PPO ratio is taken against, and each token's loss needs the capped weight π_old/π_gen "
        f"(the decoupled loss, docs/guides/async.md)",
    )
    require(
        cfg.value.target_correction == "none" or cfg.has_critic,
        "value.target_correction",
        f"{cfg.value.target_correction} corrects the critic's targets; ppo.advantage_estimator=grpo has no critic",
    )


def _check_sample_selection(cfg: Config) -> None:
    """Dynamic sampling refills a step on the policy's own ranks and needs groups its criterion can judge; the
    overlong penalty is measured against one response's limit."""
    sampling, ppo = cfg.ppo.dynamic_sampling, cfg.ppo
    if sampling.enabled:
        require(
            cfg.cluster.generation_ranks == 0,
            "ppo.dynamic_sampling.enabled",
            "with cluster.generation_ranks > 0 (asynchronous generation) is not supported yet: a step's extra "
            "batches are generated on the policy's own ranks",
        )
        require(
            sampling.criterion != "reward_std" or ppo.num_generations_per_prompt >= 2,
            "ppo.dynamic_sampling.criterion",
            "reward_std needs ppo.num_generations_per_prompt >= 2 (a group of one sample has no reward spread and "
            "would always be dropped); with a critic, value_error judges single samples",
        )
        require(
            sampling.criterion != "value_error" or cfg.has_critic,
            "ppo.dynamic_sampling.criterion",
            "value_error compares returns with the critic's values; ppo.advantage_estimator=grpo has no critic",
        )
    shaping = ppo.overlong_shaping
    if shaping.enabled:
        require(
            not cfg.env.multi_turn,
            "ppo.overlong_shaping.buffer",
            "applies to single-turn responses (an episode's length limit is env.max_total_tokens, shared with "
            "observations); multi-turn episodes are not supported yet",
        )
        require(
            shaping.buffer <= cfg.policy.generation.max_new_tokens,
            "ppo.overlong_shaping.buffer",
            f"{shaping.buffer} must be at most policy.generation.max_new_tokens = "
            f"{cfg.policy.generation.max_new_tokens}",
        )


def _check_critic_start(cfg: Config) -> None:
    """A warm start and an EV-gated warmup concern a critic; the gate replaces the fixed warmup, not both."""
    value = cfg.value
    used_by = {"warm_start": value.warm_start is not None, "warmup.until_ev": value.warmup.until_ev is not None}
    for key, used in used_by.items():
        require(
            not used or cfg.has_critic,
            f"value.{key}",
            "concerns the critic; ppo.advantage_estimator=grpo has none",
        )
    require(
        value.warmup.until_ev is None or cfg.value.warmup.steps == 0,
        "value.warmup.steps",
        f"must be 0 with value.warmup.until_ev (the warmup ends on the critic's explained variance, capped at "
        f"value.warmup.max_steps); pick one, got {cfg.value.warmup.steps}",
    )


def _check_env(cfg: Config) -> None:
    """Episodes are run by the generator of the policy's own ranks; a turn needs room in the token budget."""
    env = cfg.env
    require(
        cfg.ppo.gae.unit == "token" or (env.multi_turn and cfg.has_critic),
        "ppo.gae.unit",
        "turn takes one GAE step per assistant turn: it needs episodes (env.class) and a critic (gae)",
    )
    require(
        cfg.ppo.gae.unit == "token" or cfg.value.target_correction == "none",
        "ppo.gae.unit",
        "turn with value.target_correction=vtrace is not supported (V-trace's ratios are per token)",
    )
    if not env.multi_turn:
        return
    require(
        cfg.cluster.generation_ranks == 0,
        "env.class",
        "multi-turn episodes run on the policy's own ranks; with cluster.generation_ranks > 0 (asynchronous "
        "generation) they are not supported yet",
    )
    require(
        cfg.env.max_total_tokens >= 2,
        "env.max_total_tokens",
        "must leave room for an assistant turn and an observation",
    )


def _check_vllm(cfg: Config) -> None:
    """What the vLLM backend supports: one whole-model engine per policy rank, built on every rank (its sampling
    rules are ``GenerationConfig``'s, its installation ``dtppo.launch.preflight``'s). On generation ranks the engines
    live there, one per generation rank, and the training ranks' layout does not concern them."""
    if cfg.cluster.generation_ranks > 0:
        return
    key = "policy.generation.backend"
    require(
        cfg.policy.parallel.cp == 1,
        "policy.parallel.cp",
        f"must be 1 with {key}=vllm in the training ranks (not run together yet; generation ranks, "
        f"cluster.generation_ranks, take a vLLM engine at any cp), got {cfg.policy.parallel.cp}",
    )
    require(
        cfg.policy.parallel.tp == 1,
        "policy.parallel.tp",
        f"must be 1 with {key}=vllm (a tensor-parallel vLLM engine inside the training ranks is not "
        f"supported yet), got {cfg.policy.parallel.tp}",
    )
    # vLLM's engine creates process groups collectively over all launched ranks, so every rank must build one.
    require(
        cfg.cluster.colocated,
        "cluster.policy_ranks",
        f"must be 0 (policy and critic colocated) with {key}=vllm, got {cfg.cluster.policy_ranks}",
    )


def _check_tiny_tensor_parallel(cfg: Config) -> None:
    """Tensor parallelism must split a tiny model's whole heads (a model directory's: ``dtppo.launch.model_checks``)."""
    for section in ("policy", "value"):
        built = _tiny_architecture(cfg, section)
        tp = getattr(cfg, section).parallel.tp
        if built is not None and tp > 1:
            require(
                built.num_kv_heads % tp == 0 and built.intermediate_size % tp == 0,
                f"{section}.parallel.tp",
                f"{tp} must divide the tiny model's num_kv_heads ({built.num_kv_heads}) and "
                f"intermediate_size ({built.intermediate_size}): tensor parallelism splits whole heads",
            )


def _tiny_architecture(cfg: Config, section: str) -> TinyModelConfig | None:
    """The tiny config ``section``'s model is built from, or None when it is loaded from a path. A critic
    without its own path starts from the policy's starting weights: policy.model.path, or the SFT model,
    itself built from policy.model.path or policy.model.tiny."""
    if section == "value" and cfg.value.model.path is not None or cfg.policy.model.path is not None:
        return None
    if section == "value" and not cfg.ppo.init_from_sft:
        return cfg.value.model.tiny
    return cfg.policy.model.tiny


def _check_layout(cfg: Config, section: Literal["policy", "value"]) -> None:
    parallel = getattr(cfg, section).parallel
    key = f"{section}.parallel.tp"
    pool = len(cfg.cluster.pool(section))
    require(
        pool % parallel.tp == 0,
        key,
        f"{parallel.tp} must divide the {section} pool's {pool} ranks (cluster.num_nodes * "
        f"cluster.workers_per_node, split by cluster.policy_ranks)",
    )
    require(
        (pool // parallel.tp) % parallel.cp == 0,
        f"{section}.parallel.cp",
        f"{parallel.cp} must divide the {section} pool's {pool // parallel.tp} ranks per tensor-parallel group "
        f"(its ranks / {key})",
    )
    dp = pool // (parallel.tp * parallel.cp)
    require(
        dp % parallel.dp_replicate == 0,
        f"{section}.parallel.dp_replicate",
        f"{parallel.dp_replicate} must divide the {section} pool's {dp} data-parallel ranks "
        f"(its ranks / ({key} · {section}.parallel.cp))",
    )


def _check_lora(cfg: Config, section: Literal["policy", "value"]) -> None:
    """Adapters wrap the linear layers the tensor-parallel plan shards (PEFT's layers are not nn.Linear): LoRA
    trains under FSDP2 at tp = 1 only."""
    part = getattr(cfg, section)
    require(
        not part.lora.enabled or part.parallel.tp == 1,
        f"{section}.parallel.tp",
        f"must be 1 with {section}.lora.rank > 0 (tensor parallelism shards nn.Linear layers, and the adapters "
        f"replace them; LoRA runs under FSDP2 data parallelism), got {part.parallel.tp}",
    )


def _check_batches(cfg: Config, section: Literal["policy", "value"]) -> None:
    """A minibatch of ``global_batch`` samples is split evenly over the ``dp`` ranks, then into microbatches
    of at most ``train_micro_batch_size`` (an upper bound: clamped to the rank's share, see
    ``Config.micro_batch_size``)."""
    worker, dp = getattr(cfg, section), cfg.data_parallel_size(section)
    global_batch, micro_batch = worker.train_global_batch_size, worker.train_micro_batch_size
    gkey, mkey = f"{section}.train_global_batch_size", f"{section}.train_micro_batch_size"
    require(
        cfg.samples_per_step % global_batch == 0,
        gkey,
        f"{global_batch} must divide ppo.num_prompts_per_step * ppo.num_generations_per_prompt "
        f"= {cfg.samples_per_step}",
    )
    require(
        global_batch % dp == 0,
        gkey,
        f"{global_batch} must divide evenly over the {dp} data-parallel ranks "
        f"(the {section} pool's ranks / ({section}.parallel.tp · {section}.parallel.cp))",
    )
    share = global_batch // dp
    require(
        share % cfg.micro_batch_size(section) == 0,
        mkey,
        f"{micro_batch} must divide the per-rank share of {gkey} = {share} (or be at least that share)",
    )


def batch_clamp_notes(cfg: Config) -> list[str]:
    """One line per role whose per-rank sizes were clamped to a rank's share (logged once, by rank 0):
    ``train_micro_batch_size`` against the global batch; the inference chunk sizes (``policy.logprob_batch_size``,
    ``value.inference_batch_size``) against the step's samples, which ``map_rows`` splits over the same ranks."""
    notes = []
    for role, chunk_key in [("policy", "logprob_batch_size"), ("value", "inference_batch_size")]:
        section, dp = getattr(cfg, role), cfg.data_parallel_size(role)
        clamped = []
        if cfg.micro_batch_size(role) < section.train_micro_batch_size:
            clamped.append(f"train_micro_batch_size {section.train_micro_batch_size} -> {cfg.micro_batch_size(role)}")
        chunk, step_share = getattr(section, chunk_key), cfg.samples_per_step // dp
        if chunk > step_share:
            clamped.append(f"{chunk_key} {chunk} -> {step_share}")
        if clamped:
            notes.append(
                f"{role}: per-rank sizes clamped to a rank's share over {dp} data-parallel ranks: " + ", ".join(clamped)
            )
    return notes


def warn_unusual(cfg: Config) -> None:
    """Valid settings that exist for one experiment, not for training: said loudly, once per run (at load,
    in the launching process; ranks rebuild the config with ``from_dict``, which stays quiet)."""
    if not cfg.value.shift_values:
        print(
            "dtppo: WARNING: value.shift_values=false reads V(s_t) from the hidden state that has already "
            "seen token t. It exists only for the value-alignment experiment (bench/learning/critic.py alignment); "
            "do not train with it.",
            file=sys.stderr,
            flush=True,
        )
