"""The vLLM generation backend: one in-process vLLM engine per policy rank, colocated with training.

Built once from the starting weights, refit in place after each update (one full tensor at a time into
``reload_weights``); token ids in and out, no vLLM tokenizer. Its log-probs are of the tempered distribution the
tokens were drawn from, as the trainer computes them. Executors, seeds, threads and limits:
docs/design/generation.md.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import PreTrainedModel

from dtppo.generation.sampler import left_padded, right_padded, splitmix
from dtppo.models.ties import tied_names, untied
from dtppo.models.weights import full_parameters
from dtppo.types import Experience, SampleRequest

# vLLM reads these when it is imported / the engine is built. The in-process engine is the only layout dtppo
# supports; vLLM's INFO lines (a few dozen per engine) would bury the run's own output unless asked for.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


class HarmlessVLLMWarnings(logging.Filter):
    """Drops two warnings every dtppo engine logs, and nothing else:

    - "RotaryEmbedding: Failed to load weights", at every ``reload_weights``: the rotary layer's cos/sin cache is
      computed from the config, not loaded, and vLLM puts the existing one back. Any other layer's warning passes.
    - "Chat template warmup failed" (with a traceback), at every engine start: vLLM renders a test chat through the
      tokenizer, and dtppo starts the engine without one (``skip_tokenizer_init``; prompts arrive as token ids).
    """

    DROPPED = ("RotaryEmbedding: Failed to load weights", "Chat template warmup failed")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.DROPPED


# The loggers those warnings come from (vLLM names its loggers after their modules).
FILTERED_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise", "vllm.renderers.base")


def request_seeds(key: int, sample_ids: torch.Tensor) -> list[int]:
    """One non-negative 63-bit seed per sample: a hash of (stream key, global sample id). sample_ids: [B]."""
    mixed = splitmix(sample_ids.long() + splitmix(torch.tensor(key, dtype=torch.long)))
    return [int(s) & ((1 << 63) - 1) for s in mixed]


def executor_backend(device: torch.device) -> str | None:
    """vLLM's ``distributed_executor_backend`` for an engine on ``device``: the external launcher on a GPU rank of a
    process group (every rank builds its engine, as dtppo requires; the engine's worker then sits on cuda:LOCAL_RANK,
    the rank's own GPU), else vLLM's default. Raises when LOCAL_RANK does not name ``device``."""
    if device.type != "cuda" or not torch.distributed.is_initialized():
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.index != local_rank:
        raise RuntimeError(
            f"policy.generation.backend=vllm: this rank trains on {device} but LOCAL_RANK is {local_rank}, and "
            f"vLLM's engine would take cuda:{local_rank}: launch one rank per GPU with LOCAL_RANK set (torchrun, "
            f"dtppo's launcher or Ray do)"
        )
    return "external_launcher"


def _check_current_device(device: torch.device) -> None:
    """The engine must leave this rank's current CUDA device as it found it: FSDP2 shards onto the current device."""
    if device.type == "cuda" and torch.cuda.current_device() != device.index:
        raise RuntimeError(
            f"policy.generation.backend=vllm: building the engine moved this rank's current CUDA device from "
            f"{device} to cuda:{torch.cuda.current_device()} (an engine on another rank's GPU)"
        )


def _untied_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each tensor once, under its first name: a tied lm_head is left out (as HF saves it),
    so the embedding it shares is what vLLM loads."""
    return {name: t.detach().contiguous() for name, t in untied(model.state_dict(), tied_names(model)).items()}


class VLLMEngine:
    """A ``Generator``: a vLLM ``LLM`` holding a copy of the policy, refit in place, asleep between rollouts
    where the build supports sleep mode (GPU builds)."""

    def __init__(
        self,
        model: PreTrainedModel,
        stop_ids: Sequence[int],
        pad_id: int,
        max_model_len: int,
        kv_cache_mib: int,
        seed: int,
        device: torch.device,
    ):
        """device: where the policy trains (sharded weights are gathered there for a refit)."""
        from vllm import LLM
        from vllm.platforms import current_platform

        self.stop_ids, self.pad_id, self.version = tuple(stop_ids), pad_id, 0
        self.device = device
        # Sleep mode exists on CUDA/ROCm/XPU builds only; the CPU build rejects enable_sleep_mode=True.
        self.sleep_supported = bool(current_platform.is_sleep_mode_available())
        for name in FILTERED_LOGGERS:
            vllm_logger = logging.getLogger(name)
            if not any(isinstance(f, HarmlessVLLMWarnings) for f in vllm_logger.filters):
                vllm_logger.addFilter(HarmlessVLLMWarnings())
        self.asleep = False
        dtype = next(model.parameters()).dtype
        with tempfile.TemporaryDirectory(prefix="dtppo-vllm-") as directory:
            # Written by hand, not save_pretrained: under torch.distributed that writes on global rank 0 only,
            # and every rank's engine loads its own copy.
            model.config.to_json_file(os.path.join(directory, "config.json"))
            save_file(_untied_state_dict(model), os.path.join(directory, "model.safetensors"))
            self.llm = LLM(
                model=directory,
                skip_tokenizer_init=True,
                dtype=dtype,
                seed=seed,
                max_model_len=max_model_len,
                kv_cache_memory_bytes=kv_cache_mib << 20,
                enable_prefix_caching=False,
                enforce_eager=True,
                logprobs_mode="processed_logprobs",
                # A prompt prefilled in chunks rewinds its seeded generator, which CPU generators
                # cannot do ("CPU Generator does not use offset"): prefill every prompt whole.
                enable_chunked_prefill=False,
                max_num_batched_tokens=max(max_model_len, 8192),
                enable_sleep_mode=self.sleep_supported,
                distributed_executor_backend=executor_backend(device),
            )
        _check_current_device(device)

    def describe(self) -> str:
        sleep = "asleep between rollouts" if self.sleep_supported else "awake throughout (no sleep mode here)"
        return f"vllm backend, one in-process engine per policy rank, {sleep}"

    def prepare(self) -> None:
        """Undo ``finish`` (weights back on the device, KV cache reallocated); nothing when awake or on CPU."""
        if self.asleep:
            if self.device.type == "cuda":
                # The update's freed activations stay reserved by torch's allocator until emptied, and the KV
                # cache vLLM reallocates now would not fit beside them on a GPU sized to the job.
                torch.cuda.empty_cache()
            self.llm.wake_up()
            self.asleep = False

    def finish(self) -> None:
        """Where supported (GPU builds): sleep level 1, free the KV cache and move the weights to host memory.
        CPU: nothing."""
        if self.sleep_supported and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def sample(self, request: SampleRequest) -> Experience:
        """``Generator.sample``: right-padded ``[prompt | response | pad]`` rows, the first stop token kept when
        sampled, ``gen_logprobs`` from vLLM; each request seeded from the stream key and its sample id."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        prompts, params, stop_ids, pad_id = request.prompts, request.params, self.stop_ids, self.pad_id
        # ignore_eos + stop_token_ids: dtppo's stop set is the only stop (vLLM's own EOS would come from the config
        # it was given, which names one EOS, not the generation config's list).
        requests = [
            VLLMSamplingParams(
                n=1,
                temperature=0.0 if params.greedy else params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                min_tokens=params.min_new_tokens,
                stop_token_ids=list(stop_ids),
                ignore_eos=True,
                logprobs=0,
                detokenize=False,
                seed=seed,
            )
            for seed in request_seeds(request.key, request.sample_ids)
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], requests, use_tqdm=False)
        tokens = torch.full((len(prompts), params.max_new_tokens), pad_id, dtype=torch.long)
        logprobs = torch.zeros((len(prompts), params.max_new_tokens))
        for row, output in enumerate(outputs):
            sample = output.outputs[0]
            ids = list(sample.token_ids)
            tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            logprobs[row, : len(ids)] = torch.tensor([step[tok].logprob for tok, step in zip(ids, sample.logprobs)])
        ids, _, prompt_lengths = left_padded(prompts, pad_id, torch.device("cpu"))
        return right_padded(ids, prompt_lengths, tokens, logprobs, stop_ids, pad_id)

    def refit(self, trained: nn.Module, version: int) -> None:
        """Load the weights of ``trained`` in place (HF parameter names, full tensors), gathered one tensor at a time
        and consumed lazily by vLLM, so the extra memory stays near one layer."""
        self.prepare()
        weights = full_parameters(trained, self.device)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.version = version

    def close(self) -> None:
        """Destroy the process groups vLLM built over the job's ranks, while the job's default group still
        exists; the engine cannot generate afterwards. Without this, vLLM's exit handler tries to destroy them
        after the job has torn its groups down and prints a traceback at exit."""
        from vllm.distributed import parallel_state

        parallel_state.destroy_model_parallel()
        parallel_state.get_world_group().destroy()  # a second destroy (vLLM's, at exit) finds nothing to do
