"""One PPOLoop with policy.generation.backend=vllm, driven step by step; tests/functional/test_vllm.py runs this
in its own process (one engine for all the checks, OMP_NUM_THREADS=1 as the CLI sets it) and asserts on the JSON
it writes. Usage (the repository root on PYTHONPATH): python -m tests.support.vllm_probe SFT_DIR OUT.json
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from dtppo import config as config_lib  # noqa: E402
from dtppo.data.chat import encode_prompts  # noqa: E402
from dtppo.generation.generator import TorchGenerator  # noqa: E402
from dtppo.generation.sampler import stream_key  # noqa: E402
from dtppo.models.causal_lm import stop_token_ids  # noqa: E402
from dtppo.ppo.trainer import PPOLoop  # noqa: E402
from dtppo.types import SampleRequest, SamplingParams  # noqa: E402
from tests.support.recipes import FAST, TINY  # noqa: E402

STEPS_WITH_REFIT, STEPS_WITHOUT_REFIT = 3, 2


def responses(experience) -> list[list[int]]:
    return [row[m.bool()].tolist() for row, m in zip(experience.input_ids, experience.response_mask)]


def sampling_checks(trainer: PPOLoop) -> dict:
    """Greedy tokens of both backends on the same weights; reruns, batch splits and order of seeded samples."""
    cfg, worker, tok = trainer.cfg, trainer.policy.worker, trainer.tokenizer
    prompts = encode_prompts(tok, trainer.validation_problems[:16], cfg.data)
    ids, key, n = torch.arange(16), stream_key(cfg.ppo.seed, 0), cfg.policy.generation.max_new_tokens
    greedy = SamplingParams(n, greedy=True)
    by_vllm = worker.generator.sample(SampleRequest(prompts, greedy, key, ids))
    torch_generator = TorchGenerator(worker.model, stop_token_ids(worker.model, tok), tok.pad_token_id)
    by_torch = torch_generator.sample(SampleRequest(prompts, greedy, key, ids))
    tempered = SamplingParams(n, temperature=cfg.policy.generation.temperature)
    whole = responses(worker.generator.sample(SampleRequest(prompts, tempered, key, ids)))
    halves = responses(worker.generator.sample(SampleRequest(prompts[:8], tempered, key, ids[:8]))) + responses(
        worker.generator.sample(SampleRequest(prompts[8:], tempered, key, ids[8:]))
    )
    reversed_order = responses(worker.generator.sample(SampleRequest(prompts[::-1], tempered, key, ids.flip(0))))[::-1]
    # 256 prompts (~20k prompt tokens) exceed one scheduler step's token budget: the first 16 rows again.
    crowded = responses(worker.generator.sample(SampleRequest(prompts * 16, tempered, key, torch.arange(256))))
    return {
        "greedy_vllm": responses(by_vllm),
        "greedy_torch": responses(by_torch),
        "whole": whole,
        "rerun": responses(worker.generator.sample(SampleRequest(prompts, tempered, key, ids))),
        "halves": halves,
        "reversed": reversed_order,
        "crowded": crowded[:16],
        "crowded_rows": len(crowded),
        "other_key": responses(worker.generator.sample(SampleRequest(prompts, tempered, key + 1, ids))),
    }


def main(sft_dir: str, out: str) -> None:
    cfg = config_lib.load(
        TINY,
        [
            *FAST,
            f"sft.output_dir={sft_dir}",
            "policy.generation.backend=vllm",
            "policy.generation.temperature=0.7",
            "policy.optimizer.lr=1e-3",
            "ppo.validation.at_start=false",
            "logger.progress=false",
        ],
    )
    trainer = PPOLoop(cfg)
    result = sampling_checks(trainer)
    steps = [trainer.step() for _ in range(STEPS_WITH_REFIT)]
    # Negative control: from here on the engine keeps the weights it has. The next step still samples from the
    # current policy; the one after samples from a policy one update old.
    trainer.policy.worker.generator.refit = lambda trained, version: None
    stale = [trainer.step() for _ in range(STEPS_WITHOUT_REFIT)]
    trainer.rewarder.close()
    result |= {
        "errors": [s["train/token_mult_prob_error"] for s in steps],
        "refit_seconds": [s["timing/weight_refit"] for s in steps],
        "errors_without_refit": [s["train/token_mult_prob_error"] for s in stale],
    }
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
