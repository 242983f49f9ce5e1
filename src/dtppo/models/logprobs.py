"""Token log-probs of a causal LM without vocabulary-sized buffers.

The HF forward would return logits for every position, ``[B, T, V]`` (151,936 entries per token for Qwen2.5),
and ``log_softmax`` over them adds more of the same size. Here the forward is asked for no logits at all
(``logits_to_keep`` empty); the final hidden state is caught on its way to the LM head and only the positions
whose log-prob is wanted go through the head, ``chunk_size`` at a time, each chunk recomputed in backward instead
of kept, its weight gradient added in place. The extra memory is about one chunk's ``[chunk, V]``, whatever the
batch.

The chunks are computed inside the LM head's own call (a forward hook), i.e. inside the model's forward: FSDP2
has the head's parameters gathered exactly then, whatever it does with them afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from dtppo.distributed.context import ContextShards
from dtppo.models.attention import Segments
from dtppo.models.context import ContextForward
from dtppo.models.packing import needed_mask, pack_rows
from dtppo.ops import shift_right


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    wanted: torch.Tensor,
    temperature: float,
    chunk_size: int,
    packing: bool,
    shards: ContextShards | None = None,
) -> torch.Tensor:
    """:func:`token_logprobs` of right-padded rows, with ``packing`` through packed rows (no pad token computed,
    ``models.packing``) and the results unpacked. input_ids, attention_mask, wanted: [B, T] -> [B, T] float32.

    Right-padded and packed rows pass the model no mask (``models.packing.needed_mask``, ``models.attention``):
    causal attention in a right-padded row never reaches its padding, and packed rows carry their sequences'
    boundaries. shards: context parallelism (``models.context``), None for whole rows."""
    if not packing:
        mask = needed_mask(attention_mask)
        return token_logprobs(model, input_ids, mask, wanted, temperature, chunk_size, shards=shards)
    packed = pack_rows(input_ids, attention_mask)
    return packed.unpack(
        token_logprobs(
            model,
            packed.input_ids,
            None,
            packed.pack(wanted),
            temperature,
            chunk_size,
            packed.position_ids,
            packed.sequence_starts,
            packed.segments,
            shards,
        )
    )


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    wanted: torch.Tensor,
    temperature: float,
    chunk_size: int,
    position_ids: torch.Tensor | None = None,
    sequence_starts: torch.Tensor | None = None,
    segments: Segments | None = None,
    shards: ContextShards | None = None,
) -> torch.Tensor:
    """log softmax(logits / temperature) of each token where ``wanted``, 0 elsewhere. -> [B, T] float32.

    model: an HF causal LM (``base_model``, ``get_output_embeddings`` and ``logits_to_keep``, as Qwen2, Llama,
    GPT-2 have). input_ids: [B, T]; attention_mask: [B, T] padding mask, or None for right-padded rows and for
    packed rows with their position_ids [B, T] (``models.packing``). wanted: [B, T] bool, the tokens whose log-prob
    is needed (a response mask).
    sequence_starts: [B, T] bool for packed rows: a sequence's first token has no prediction (0, as t = 0).
    segments: packed rows' sequences, for ``models.attention``'s kernel.
    shards: context parallelism: this rank computes its tokens' predictions, gathered into the rows.
    Differentiable when grad is enabled.
    """
    scored = wanted.bool().clone()
    scored[:, 0] = False  # nothing predicts a row's first token, nor (packed) a sequence's
    if sequence_starts is not None:
        scored &= ~sequence_starts.bool()
    # Position t-1 scores token t: which positions score and the ids they score are built on the whole row; the
    # one shift helper then moves each result to the token it scores.
    scoring = torch.cat([scored[:, 1:], torch.zeros_like(scored[:, :1])], dim=1)
    next_ids = torch.cat([input_ids[:, 1:], torch.zeros_like(input_ids[:, :1])], dim=1)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    if segments is not None:
        inputs["dtppo_segments"] = segments
    context = None
    if shards is not None:
        context = ContextForward.of(shards, input_ids, position_ids, sequence_starts, attention_mask)
        scoring, next_ids = context.shard(scoring), context.shard(next_ids)
        inputs = {"input_ids": context.input_ids, "position_ids": context.position_ids, "dtppo_context": context.rows}
    rows, cols = scoring.nonzero(as_tuple=True)
    with _head_over(model, rows, cols, next_ids[rows, cols], temperature, chunk_size) as result:
        model(**inputs, logits_to_keep=torch.zeros(0, dtype=torch.long, device=input_ids.device), use_cache=False)
    out = torch.zeros(scoring.shape, dtype=torch.float32, device=input_ids.device)
    out = out.index_put((rows, cols), result["logprobs"])
    return shift_right(context.gather(out) if context is not None else out, sequence_starts)


@contextmanager
def _head_over(
    model: nn.Module, rows: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Hooks for one forward: the base model's last hidden state is kept, and the LM head's call computes the
    chunked log-probs of ``targets``, the tokens the hidden states at (rows, cols) predict, into the yielded dict's
    ``"logprobs"``: [N] float32."""
    caught: dict[str, torch.Tensor] = {}
    head = model.get_output_embeddings()

    def keep_hidden(module, args, output):
        caught["hidden"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    def score(module, args, output):
        hidden = caught.pop("hidden")[rows, cols]
        caught["logprobs"] = chunked_logprobs(hidden, module.weight, module.bias, targets, temperature, chunk_size)

    handles = [model.base_model.register_forward_hook(keep_hidden), head.register_forward_hook(score)]
    try:
        yield caught
    finally:
        for handle in handles:
            handle.remove()


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int,
) -> torch.Tensor:
    """log softmax((hidden·Wᵀ + b) / temperature) at ``targets``, ``chunk_size`` rows at a time.

    hidden: [N, H]; weight: [V, H]; bias: [V] or None; targets: [N] int64 -> [N] float32. Backward recomputes each
    chunk's logits and adds its weight gradient into one buffer in place, so neither pass holds more than one
    ``[chunk, V]`` (autograd would keep every chunk's logits, or materialise a ``[V, H]`` gradient per chunk).
    """
    return _ChunkedLogprobs.apply(hidden, weight, bias, targets, temperature, chunk_size)


class _ChunkedLogprobs(torch.autograd.Function):
    """d log softmax(z)_t / dz = onehot(t) − softmax(z), with z = logits / temperature."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size):
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for start, logits in _chunk_logits(hidden, weight, bias, temperature, chunk_size):
            picked = logits.gather(-1, targets[start : start + len(logits), None]).squeeze(-1)
            out[start : start + len(logits)] = picked - torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # Accumulated in fp32 whatever the parameters' dtype: bf16 sums over many chunks would lose the small ones.
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        )
        grad_bias = (
            torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
            if bias is not None and ctx.needs_input_grad[2]
            else None
        )
        for start, logits in _chunk_logits(hidden, weight, bias, ctx.temperature, ctx.chunk_size):
            stop = start + len(logits)
            upstream = grad_out[start:stop, None]
            # softmax, then the gradient, all in place in the logits' buffer: one [chunk, V] at a time
            dz = logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True)).exp_().mul_(-upstream)
            dz.scatter_add_(-1, targets[start:stop, None], upstream)
            dz.div_(ctx.temperature)
            if grad_hidden is not None:
                grad_hidden[start:stop] = (dz.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(dz.t(), hidden[start:stop].float())
            if grad_bias is not None:
                grad_bias += dz.sum(0)
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float, chunk_size: int
) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, fp32 logits / temperature [chunk, V]) for each chunk of ``hidden`` [N, H]. The head's matmul runs
    in fp32 (the weight cast once per call, a no-op for fp32 parameters): bf16 logits would be rounded by up to
    2^-9 of their size (0.03-0.06 at |logit| 10-20) before the log-softmax, and the generator and the trainer would
    round apart (``train/token_mult_prob_error``)."""
    weight, bias = weight.float(), None if bias is None else bias.float()
    for start in range(0, hidden.shape[0], chunk_size):
        logits = F.linear(hidden[start : start + chunk_size].float(), weight, bias)
        yield start, logits if temperature == 1.0 else logits.div_(temperature)
