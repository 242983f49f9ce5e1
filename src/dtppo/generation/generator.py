"""The generation seam: one ``Generator`` protocol, one class per backend, built once from ``policy.generation``.

A generator holds its own whole (unsharded) copy of the policy, or samples the training model itself when that
is unsharded, and is refitted with the trainer's weights after every policy update. Everything that decides how
tokens are produced lives behind it: the backend (dtppo's torch sampler or vLLM), the torch decoder
(``policy.generation.decoder``) and its compiled decode steps (``policy.generation.decode_graph``). The policy
worker, the trainer and validation see only the protocol's methods and the weight version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

import torch
from torch import nn
from transformers import PreTrainedModel

from dtppo.config import GenerationConfig
from dtppo.generation.decoder import HFCacheDecoder, StaticKVDecoder
from dtppo.generation.decoder_weights import static_decoder_refusal
from dtppo.generation.sampler import left_padded, sample_tokens
from dtppo.models.weights import full_parameters, load_weights
from dtppo.types import Experience, SampleRequest

log = logging.getLogger(__name__)
# Distinct (batch, cache length) shapes one process compiles decode steps for. Each is a recompile of the one
# compiled decode function, and dynamo stops at its recompile limit (8 by default), with fullgraph=True as a hard
# error in the middle of a run; past this many, a rollout decodes eagerly (docs/design/generation.md).
MAX_GRAPH_SHAPES = 6
# Compiled decoders kept alive (each holds its KV cache and stacked weights): a synchronous run alternates between
# its rollout shape and its validation shape; a third shape evicts the least recently used.
GRAPH_DECODERS_KEPT = 2
_GRAPH_CACHE_ROUNDING = 64
_compiled_shapes: set[tuple[str, int, int]] = set()  # per process, as dynamo's cache of the decode function


class Generator(Protocol):
    """What samples rollouts and validation answers from the policy.

    ``version`` is the policy version of the weights the generator holds: 0 for the initial weights, then the
    number the trainer gave the last ``refit`` (the step whose update produced them).
    """

    version: int

    def describe(self) -> str:
        """One line for the run's start: the backend and how it decodes."""

    def prepare(self) -> None:
        """Before sampling: wake a backend that sleeps (vLLM's engine), put the model in eval mode."""

    def finish(self) -> None:
        """After sampling: free what sampling alone needs (a sleeping engine's KV cache), where the engine can."""

    def sample(self, request: SampleRequest) -> Experience:
        """A response to each of the request's prompts: right-padded ``[prompt | response | pad]`` rows on the CPU
        with ``gen_logprobs`` and ``truncated``, in the request's order."""

    def refit(self, trained: nn.Module, version: int) -> None:
        """Take the weights of ``trained`` (the policy as it trains, sharded or not); collective over the policy's
        ranks when it is sharded. ``version``: the policy version those weights are."""

    def close(self) -> None:
        """End of the run: release the backend's resources."""


def graph_cache_length(length: int, cache_len: int | None) -> int:
    """The cache length of a compiled decoder for a rollout of ``length`` columns (prompt width + new tokens): the
    generator's one length ``cache_len`` (its longest prompt + new tokens, rounded up to 64) whenever it fits, so
    that prompt widths never make new shapes; past it (or without it) ``length`` rounded up to 64 times a power of
    two, so that longer rollouts share few lengths. The compiled step attends over the whole cache."""
    if cache_len is not None and length <= cache_len:
        return -(-cache_len // _GRAPH_CACHE_ROUNDING) * _GRAPH_CACHE_ROUNDING
    blocks = -(-length // _GRAPH_CACHE_ROUNDING)
    return _GRAPH_CACHE_ROUNDING * (1 << (blocks - 1).bit_length())


def reserve_graph_shape(device: torch.device, batch: int, max_len: int) -> bool:
    """Whether decode steps of this shape may be compiled: already compiled, or one of the first
    ``MAX_GRAPH_SHAPES`` this process compiles."""
    shape = (device.type, batch, max_len)
    if shape not in _compiled_shapes and len(_compiled_shapes) >= MAX_GRAPH_SHAPES:
        return False
    _compiled_shapes.add(shape)
    return True


def resolve_decoder(
    model: PreTrainedModel, decoder: Literal["auto", "hf", "static"], compile: bool = False
) -> Literal["hf", "static"]:
    """The torch decoder ``policy.generation.decoder`` selects for ``model``: ``auto`` is ``static`` where the
    hand-written static-KV decoder implements the architecture (``static_decoder_refusal`` is None), else ``hf``.
    ``compile`` (``policy.generation.decode_graph``) needs the static decoder. Raises ValueError naming the key."""
    refusal = static_decoder_refusal(model)
    if decoder == "static" and refusal is not None:
        raise ValueError(
            f"policy.generation.decoder: static (dtppo's static-KV decoder) cannot decode this model: {refusal} "
            f"(use auto or hf)"
        )
    chosen = ("static" if refusal is None else "hf") if decoder == "auto" else decoder
    if compile and chosen != "static":
        why = f": {refusal}" if refusal is not None else ""
        raise ValueError(
            f"policy.generation.decode_graph: compiled decode steps need the static decoder; "
            f"this {model.config.model_type} model decodes through the HF forward{why}"
        )
    return chosen


class TorchGenerator:
    """dtppo's KV-cache sampler (``rollout.sampler``) on a whole model, with the decoder chosen once.

    ``compile``: decode steps run as one compiled graph each (``policy.generation.decode_graph``; static decoder
    only). The compiled decoders, one per (batch, cache length) with cache lengths from ``graph_cache_length``
    (``cache_len``: the longest prompt + new tokens a rollout can need), are kept here across rollouts and
    refreshed in place with the current weights: a CUDA graph reads fixed addresses, and a new address re-records
    it (torch stops recording a function after 128 unexpected re-records and falls back to eager). At most
    ``GRAPH_DECODERS_KEPT`` are kept (least recently used evicted), and past ``MAX_GRAPH_SHAPES`` shapes in the
    process a rollout decodes eagerly, with one warning.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        stop_ids: Sequence[int],
        pad_id: int,
        decoder: Literal["auto", "hf", "static"] = "auto",
        compile: bool = False,
        cache_len: int | None = None,
    ):
        self.model, self.stop_ids, self.pad_id, self.compile = model, tuple(stop_ids), pad_id, compile
        self.decoder = resolve_decoder(model, decoder, compile)
        self.cache_len = cache_len
        self.graph_decoders: dict[tuple[int, int], StaticKVDecoder] = {}  # least recently used first
        self.warned_past_cap = False
        self.version = 0

    def describe(self) -> str:
        graph = ", each decode step one compiled graph" if self.compile else ""
        line = f"torch backend, {self.decoder} decoder ({self.model.config.model_type} model){graph}"
        refusal = static_decoder_refusal(self.model) if self.decoder == "hf" else None
        return line if refusal is None else f"{line}: {refusal}"

    def prepare(self) -> None:
        self.model.eval()

    def finish(self) -> None:
        """Nothing: the model stays resident (it is the training model, or a replica of it)."""

    @torch.no_grad()
    def sample(self, request: SampleRequest) -> Experience:
        device = next(self.model.parameters()).device
        ids, attn, prompt_lengths = left_padded(request.prompts, self.pad_id, device)
        decoder = self._decoder(ids.shape[0], ids.shape[1] + request.params.max_new_tokens)
        return sample_tokens(
            decoder,
            ids,
            attn,
            prompt_lengths,
            request.params,
            self.stop_ids,
            self.pad_id,
            request.key,
            request.sample_ids,
        ).to("cpu")

    def _decoder(self, batch: int, length: int) -> StaticKVDecoder | HFCacheDecoder:
        """A decoder for one rollout of ``batch`` rows and ``length`` tokens (prompt width + new tokens)."""
        if self.decoder == "hf":
            return HFCacheDecoder(self.model)
        if not self.compile:
            return StaticKVDecoder(self.model, batch, length)
        shape = (batch, graph_cache_length(length, self.cache_len))
        decoder = self.graph_decoders.pop(shape, None)
        if decoder is not None:
            decoder.refresh()
        elif reserve_graph_shape(next(self.model.parameters()).device, *shape):
            decoder = StaticKVDecoder(self.model, *shape, compile=True)
        else:
            if not self.warned_past_cap:
                log.warning(
                    "policy.generation.decode_graph: this process has compiled decode steps for %d shapes (batch, "
                    "cache length), the most it compiles; rollouts of other shapes, first %s, decode eagerly",
                    MAX_GRAPH_SHAPES,
                    shape,
                )
                self.warned_past_cap = True
            return StaticKVDecoder(self.model, batch, length)
        self.graph_decoders[shape] = decoder
        while len(self.graph_decoders) > GRAPH_DECODERS_KEPT:
            del self.graph_decoders[next(iter(self.graph_decoders))]
        return decoder

    def refit(self, trained: nn.Module, version: int) -> None:
        """The trained model's whole weights (adapters merged, ``models.weights``) into the replica (collective when
        sharded); nothing to copy when the generator samples the training model itself."""
        if trained is not self.model:
            load_weights(self.model, full_parameters(trained, next(self.model.parameters()).device))
        self.version = version

    def close(self) -> None:
        """Nothing to release."""


def build_generator(
    gen: GenerationConfig,
    model: PreTrainedModel,
    stop_ids: Sequence[int],
    pad_id: int,
    *,
    max_prompt_tokens: int,
    seed: int,
    device: torch.device,
    replica: Callable[[nn.Module], nn.Module] | None,
) -> Generator:
    """The generator ``policy.generation`` selects, from the policy's whole, not yet wrapped ``model``.

    replica: makes the torch generator's own copy (a sharded policy: ranks then decode independently, with no
    collective per token, and may stop at different lengths); None: the torch generator samples ``model``
    itself, the training model. vLLM always loads its own copy. device: where the policy trains.
    """
    if gen.backend == "vllm":
        from dtppo.generation.vllm_engine import VLLMEngine  # imports vLLM's settings into the environment

        max_len = min(max_prompt_tokens + gen.max_new_tokens, model.config.max_position_embeddings)
        return VLLMEngine(model, stop_ids, pad_id, max_len, gen.vllm_kv_cache_mib, seed, device)
    return TorchGenerator(
        replica(model) if replica is not None else model,
        stop_ids,
        pad_id,
        gen.decoder,
        compile=gen.decode_graph,
        cache_len=max_prompt_tokens + gen.max_new_tokens,
    )
