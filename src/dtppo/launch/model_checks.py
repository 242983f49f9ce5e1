"""What a recipe asks of its models, checked against the models themselves by ``preflight``, before any compute.

Read from the model directories (``config.json`` and the tokenizer files, JSON only; the weights are never
loaded here): weights in safetensors only (a pickled ``pytorch_model.bin`` is refused, never opened), a tokenizer
(``models.tokenizer``), tensor parallelism against the real head and MLP sizes, the sharding plan against the real
architecture (built on the meta device), activation checkpointing against the model class, the critic's
vocabulary against the policy's, the chat template against the prompts it must render, the torch generator's
decoder against the architecture, the critic's export (some layout must write it) and the head size against the
vLLM CPU build's kernels. Each failure is one ConfigError naming its key. Hub names (not local directories) are
checked when the model loads instead.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import jinja2.meta
import torch
from transformers import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_MAPPING,
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)
from transformers.utils.chat_template_utils import _compile_jinja_template

from dtppo.config import Config, ConfigError, TinyModelConfig
from dtppo.config.inputs import TEMPLATE_OWN_NAMES
from dtppo.data.chat import ChatFormat, conversation, format_prompt
from dtppo.distributed.parallelize import decoder_layers, tensor_parallel_plan_fits
from dtppo.errors import InputError
from dtppo.generation.generator import resolve_decoder
from dtppo.models.critic_format import export_refusal
from dtppo.models.loading import weights_refusal
from dtppo.models.tokenizer import load_tokenizer

SUPPORTED_LAYOUTS = "Qwen2/Llama-style blocks (model.layers[i].self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj)"


def check_models(cfg: Config) -> None:
    """Each rule above, for the policy and (with a critic) the value model. Raises ConfigError."""
    policy_path, value_path = cfg.policy.model.path, cfg.value.model.path
    policy_config = _read_model(policy_path, "policy.model.path", "the policy") if _local(policy_path) else None
    critic = cfg.has_critic
    value_config = _read_model(value_path, "value.model.path", "the critic") if critic and _local(value_path) else None
    if policy_path is not None and policy_config is None:
        return  # a hub name: transformers resolves (and checks) it when the model loads
    tokenizer = _tokenizer(policy_path, "policy.model.path")
    _check_chat_template(cfg, tokenizer)
    if policy_config is not None:
        _check_model(cfg, "policy", "policy.model.path", policy_path, policy_config)
    if value_config is not None:
        _check_model(cfg, "value", "value.model.path", value_path, value_config)
        _check_same_vocabulary(cfg, tokenizer, _tokenizer(value_path, "value.model.path"))
    elif critic and value_path is None and policy_config is not None:
        _check_model(cfg, "value", "policy.model.path", policy_path, policy_config)  # the critic starts from it
    if cfg.policy.generation.backend == "vllm":
        _check_vllm_head_dim(cfg, _head_dim(policy_config, cfg.policy.model.tiny))
    elif policy_config is not None:
        _check_decoder(cfg, policy_config)


def _check_decoder(cfg: Config, config: PretrainedConfig) -> None:
    """The torch generator's decoder exists for the policy's architecture (``rollout.generator``), found on a
    meta-device build of the model (no weights are read)."""
    gen = cfg.policy.generation
    if gen.decoder == "hf" or (gen.decoder == "auto" and not gen.decode_graph):
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    try:
        resolve_decoder(model, gen.decoder, gen.decode_graph)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _local(path: str | None) -> bool:
    return path is not None and Path(path).is_dir()


def _tokenizer(path: str | None, key: str) -> PreTrainedTokenizerBase:
    try:
        return load_tokenizer(path)
    except InputError as err:
        raise ConfigError(f"{key}: {err}") from None


def _read_model(path: str, key: str, model: str) -> PretrainedConfig:
    """The config of the model directory ``path``, whose weights must be safetensors (``weights_refusal``; a hub
    model's pickled weights are refused as it loads, by ``use_safetensors``)."""
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # transformers refuses a config.json in many ways; each is one line here
        raise ConfigError(f"{key}: cannot read {path}/config.json: {type(err).__name__}: {_first_line(err)}") from None
    refusal = weights_refusal(path, model)
    if refusal is not None:
        raise ConfigError(f"{key}: {path}: {refusal}")
    return config


def _check_model(cfg: Config, section: str, key: str, path: str, config: PretrainedConfig) -> None:
    _check_layout(cfg, section, key, path, config)
    _check_activation_checkpointing(cfg, section, key, config)
    if section == "value":
        _check_critic_export(key, path, config)


def _check_critic_export(key: str, path: str, config: PretrainedConfig) -> None:
    """The critic can be written when the run ends (``dtppo export``, ``ValueModel.save_pretrained``: token
    classification, or the base model plus its head), found on meta-device builds: refused now, not after training."""
    reason = export_refusal(config)
    if reason is not None:
        raise ConfigError(
            f"{key}: a critic starting from {path} ({config.model_type}) could not be built or exported: {reason}; "
            f"start the critic from another model (value.model.path), or train without one "
            f"(ppo.advantage_estimator=grpo)"
        )


def _check_activation_checkpointing(cfg: Config, section: str, key: str, config: PretrainedConfig) -> None:
    """``activation_checkpointing`` goes through transformers' own per-block switch (``models.recompute``): the
    model's class must have one. The class is looked up, not built."""
    if not getattr(cfg, section).activation_checkpointing:
        return
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING if section == "policy" else MODEL_MAPPING
    try:
        model_class = mapping[type(config)]
    except KeyError:
        return  # no such class for this config: loading the model reports it, naming the path
    if not model_class.supports_gradient_checkpointing:
        raise ConfigError(
            f"{section}.activation_checkpointing: {model_class.__name__} ({config.model_type}, {key}) "
            f"has no activation checkpointing in transformers (supports_gradient_checkpointing is "
            f"False): set {section}.activation_checkpointing=false"
        )


def _check_layout(cfg: Config, section: str, key: str, path: str, config: PretrainedConfig) -> None:
    """``tp`` splits whole heads, kv heads and MLP columns; a multi-rank pool has a sharding plan for the model."""
    tp = getattr(cfg, section).parallel.tp
    tp_key = f"{section}.parallel.tp"
    if len(cfg.cluster.pool(section)) == 1:
        return
    with torch.device("meta"):
        skeleton = (AutoModelForCausalLM if section == "policy" else AutoModel).from_config(config)
    if tp > 1 and not tensor_parallel_plan_fits(skeleton):
        raise ConfigError(
            f"{tp_key}: tensor parallelism supports {SUPPORTED_LAYOUTS}; {config.model_type} "
            f"({key}) is laid out otherwise: use {tp_key}=1 (FSDP alone shards any model)"
        )
    if tp > 1:
        heads = config.num_attention_heads
        for name, size in [
            ("num_attention_heads", heads),
            ("intermediate_size", config.intermediate_size),
            ("num_key_value_heads", getattr(config, "num_key_value_heads", None) or heads),
        ]:
            if size % tp != 0:
                raise ConfigError(
                    f"{tp_key}: {tp} must divide the model's {name} ({size}; {key} = {path}): "
                    f"tensor parallelism splits whole heads and MLP columns"
                )
    if decoder_layers(skeleton) is None:
        print(
            f"dtppo: WARNING: {key}: {config.model_type} has no decoder blocks where the sharding plan looks "
            f"({SUPPORTED_LAYOUTS}, or GPT-2-style transformer.h): FSDP2 shards the whole model as one unit, "
            f"so each rank gathers all of it at once",
            file=sys.stderr,
            flush=True,
        )


def _check_same_vocabulary(cfg: Config, policy: PreTrainedTokenizerBase, critic: PreTrainedTokenizerBase) -> None:
    """The critic reads the policy's token ids: any other vocabulary makes every id another token to it."""
    if critic.get_vocab() == policy.get_vocab():
        return
    source = cfg.policy.model.path or "the built-in character tokenizer (policy.model.path is null)"
    differ = sum(1 for token, i in policy.get_vocab().items() if critic.get_vocab().get(token) != i)
    raise ConfigError(
        f"value.model.path: its tokenizer ({len(critic)} tokens) is not the policy's ({source}, "
        f"{len(policy)} tokens; {differ} of the policy's tokens have another id or none): the critic "
        f"reads the policy's token ids, so start it from a model with the policy's vocabulary, or "
        f"leave value.model.path null (the critic then starts from the policy)"
    )


def _check_chat_template(cfg: Config, tokenizer: PreTrainedTokenizerBase) -> None:
    """Every prompt goes through the policy tokenizer's chat template, with ``data.system_prompt`` when set and
    ``data.chat_template_kwargs`` (each a variable the template reads); in a multi-turn run, the observations given
    as chat messages too (``ChatFormat.turn_text``)."""
    where = cfg.policy.model.path
    if tokenizer.chat_template is None:
        raise ConfigError(
            f"policy.model.path: the tokenizer of {where} has no chat template (tokenizer_config.json "
            f"`chat_template` or chat_template.jinja), and dtppo renders every prompt through it: use a "
            f"model that has one, or add one to the directory"
        )
    chat = ChatFormat.of(cfg.data)
    try:
        format_prompt(tokenizer, "What is 1 + 1?", dataclasses.replace(chat, system_prompt=None))
    except Exception as err:
        raise ConfigError(
            f"policy.model.path: the chat template of {where} cannot render a user turn: "
            f"{type(err).__name__}: {_first_line(err)}"
        ) from None
    if cfg.data.system_prompt:
        try:
            format_prompt(tokenizer, "What is 1 + 1?", chat)
        except Exception as err:
            raise ConfigError(
                f"data.system_prompt: the chat template of {where} refuses a system turn "
                f"({type(err).__name__}: {_first_line(err)}): set data.system_prompt to null"
            ) from None
    _check_template_variables(cfg, tokenizer)
    if cfg.env.multi_turn:
        _check_turn_text(cfg, chat, tokenizer)


def _check_template_variables(cfg: Config, tokenizer: PreTrainedTokenizerBase) -> None:
    """A name in ``data.chat_template_kwargs`` that changes nothing the template renders would be ignored, silently:
    a misspelt ``enable_thinking``, or a name the template reads only after setting it itself (Qwen3's ``content``).
    Each is rendered into the conversations dtppo renders, with its value and the probe values and without it."""
    if not cfg.data.chat_template_kwargs:
        return
    template = tokenizer.get_chat_template()
    # transformers' own compiled environment: its extensions (the {% generation %} tag) parse as they render.
    reads = jinja2.meta.find_undeclared_variables(_compile_jinja_template(template).environment.parse(template))
    chat = ChatFormat.of(cfg.data)
    effective = [name for name in sorted(reads - TEMPLATE_OWN_NAMES) if _changes_renderings(chat, tokenizer, name)]
    for name, value in cfg.data.chat_template_kwargs:
        if name in effective or (name in reads and _changes_renderings(chat, tokenizer, name, value)):
            continue
        why = "renders the same text with it as without it" if name in reads else "does not read it"
        raise ConfigError(
            f"data.chat_template_kwargs.{name}: the chat template of {cfg.policy.model.path} {why} (the variables "
            f"that change what it renders: {', '.join(effective) or 'none'}): remove it, or correct its name"
        )


# Values a template variable is tried with: whatever a template tests of it (defined, true, none, equal to a number or
# to a string), one of them differs from its absence.
_PROBES = (True, False, None, 0, 1, "dtppo-probe")
_ASKED, _ANSWER = {"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "2"}
# A prompt, an SFT row, an episode's second turn: (messages, add_generation_prompt)
_RENDERED = (([_ASKED], True), ([_ASKED, _ANSWER], False), ([_ASKED, _ANSWER, _ASKED], True))


def _changes_renderings(chat: ChatFormat, tokenizer: PreTrainedTokenizerBase, name: str, *values: Any) -> bool:
    """Whether the template variable ``name`` changes a rendering of ``_RENDERED``: with each of ``values`` and
    ``_PROBES`` against without it (the run's other variables kept)."""
    others = tuple((n, v) for n, v in chat.template_kwargs if n != name)
    without = _renderings(dataclasses.replace(chat, template_kwargs=others), tokenizer)
    return any(
        _renderings(dataclasses.replace(chat, template_kwargs=(*others, (name, value))), tokenizer) != without
        for value in (*values, *_PROBES)
    )


def _renderings(chat: ChatFormat, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """What ``chat`` renders for each of ``_RENDERED``; a rendering that fails gives its error instead."""
    texts = []
    for messages, generation_prompt in _RENDERED:
        try:
            texts.append(
                chat.render(
                    tokenizer, conversation(messages, chat.system_prompt), add_generation_prompt=generation_prompt
                )
            )
        except Exception as err:  # the template's own raise_exception, or a value it cannot use
            texts.append(f"{type(err).__name__}: {err}")
    return texts


def _check_turn_text(cfg: Config, chat: ChatFormat, tokenizer: PreTrainedTokenizerBase) -> None:
    """An observation given as chat messages enters an episode as the text the template renders for it after an
    assistant turn; a template that cannot give that text consistently (it depends on the turns before) is refused
    now rather than at the first such observation."""
    try:
        chat.turn_text(tokenizer, [{"role": "user", "content": "7"}], None)
    except Exception as err:
        raise ConfigError(
            f"env.class: an observation given as chat messages enters an episode as the text the policy's chat "
            f"template renders for it, and the template of {cfg.policy.model.path} cannot give that text "
            f"({type(err).__name__}: {_first_line(err)}): use a model whose template renders each turn on its own"
        ) from None


def _head_dim(config: PretrainedConfig | None, tiny: TinyModelConfig) -> int:
    if config is None:
        return tiny.hidden_size // tiny.num_heads
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _check_vllm_head_dim(cfg: Config, head_dim: int) -> None:
    """vLLM's CPU build has attention kernels for a fixed set of head sizes; a GPU build is not limited here."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in sizes:
        shape = (
            "policy.model.path"
            if cfg.policy.model.path
            else "policy.model.tiny.hidden_size / policy.model.tiny.num_heads"
        )
        raise ConfigError(
            f"policy.generation.backend: vLLM's CPU build has attention kernels for head sizes "
            f"{sizes}, and the policy's is {head_dim} ({shape}): use policy.generation.backend=torch, "
            f"or a model with one of those head sizes"
        )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""
