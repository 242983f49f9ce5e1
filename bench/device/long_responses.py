"""The device check's long_responses phase (bench/device/check.py): the critic's training pass (``ValueModel.values``
forward and backward), the policy's (the response log-probs, ``models.logprobs.sequence_logprobs``, forward and
backward) and the log-prob recompute (the same without gradients), padded, on 2 rows, the second 3/4 as long as the
first, through dtppo's attention seam: at the 0.5B shape with Qwen's vocabulary on 8k and 16k tokens in bf16 on CUDA,
at a tiny shape on 256 tokens in fp32 on the CPU fallback. Per pass: seconds, the peak memory over the built
model's (device allocations on CUDA, RSS on CPU) and what autograd saves for backward."""

from __future__ import annotations

import resource
import time
from functools import partial

import torch

from bench.common.shapes import QWEN25_VOCAB, SHAPES

TINY = {"vocab_size": 128, **SHAPES["smoke"], "hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 512}


def _peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _count_storage(saved: dict[int, int], tensor: torch.Tensor) -> torch.Tensor:
    storage = tensor.untyped_storage()
    saved.setdefault(storage.data_ptr(), storage.nbytes())
    return tensor


def measure(length: int, what: str, shape: dict, device: torch.device) -> dict:
    """One pass (``what``: critic, policy or logprobs) over 2 padded rows of up to ``length`` tokens."""
    from transformers import AutoModel, AutoModelForCausalLM, Qwen2Config

    from dtppo.models.attention import KERNEL
    from dtppo.models.logprobs import sequence_logprobs
    from dtppo.models.value import ValueModel

    torch.manual_seed(0)
    config = Qwen2Config(**shape, max_position_embeddings=length + 16, tie_word_embeddings=True)
    config._attn_implementation = KERNEL
    ids = torch.randint(1, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length * 3 // 4 :] = 0
    ids, mask = (ids * mask).to(device), mask.to(device)
    model = ValueModel(AutoModel.from_config(config)) if what == "critic" else AutoModelForCausalLM.from_config(config)
    model = model.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base, saved, start = _peak_mib(device), {}, time.perf_counter()  # saved: bytes per storage, each counted once
    with torch.autograd.graph.saved_tensors_hooks(partial(_count_storage, saved), lambda t: t):
        if what == "critic":
            loss = (model.values(ids, mask) * mask).sum()
        else:
            with torch.set_grad_enabled(what == "policy"):
                loss = sequence_logprobs(model, ids, mask, mask.bool(), 1.0, 128, False, None).sum()
    if loss.requires_grad:
        loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mib": _peak_mib(device) - base, "saved_mib": sum(saved.values()) / 2**20}


def long_responses(cuda: bool) -> dict:
    """Every pass at every length; a pass that runs out of device memory is recorded as such (and fails the phase)."""
    shape = {**SHAPES["0.5b"], "vocab_size": QWEN25_VOCAB} if cuda else TINY
    device = torch.device("cuda" if cuda else "cpu")
    rows = []
    for length in (8192, 16384) if cuda else (256,):
        for what in ("critic", "policy", "logprobs"):
            row = {"T": length, "what": what, "layout": "padded", "cp": 1}
            try:
                row |= measure(length, what, shape, device)
            except torch.OutOfMemoryError:
                row["failed"] = "out of device memory"
            if cuda:
                torch.cuda.empty_cache()
            rows.append(row)
    return {"rows": rows, "passed": all("seconds" in row for row in rows)}
