"""TRL side of bench/perf/vs_trl.py. Runs inside bench/.venv-trl (trl==1.12.0, the last release with a PPOTrainer);
it does not import dtppo. vs_trl.py writes the models, tokenizer and prompts and reads back the JSON written here.

    bench/.venv-trl/bin/python -m bench.perf.trl_ppo_worker --model-dir DIR --prompts P.json --steps 5 --out R.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, PreTrainedTokenizerFast, TrainerCallback
from trl.experimental.ppo import PPOConfig, PPOTrainer
from trl.experimental.ppo import ppo_trainer as trl_ppo


class PhaseClock:
    """Seconds per phase and step: wraps the module-level functions PPOTrainer.train() calls, so the step's
    inner phases are timed without changing what TRL does."""

    def __init__(self, reward_model: torch.nn.Module):
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.reward_model = reward_model
        batch_generation, forward, get_reward = trl_ppo.batch_generation, trl_ppo.forward, trl_ppo.get_reward
        self.widths: list[int] = []  # [prompt | response] columns each step trains on

        def generation(*args, **kwargs):
            query_responses, logits = batch_generation(*args, **kwargs)
            self.widths.append(query_responses.shape[1])
            return query_responses, logits

        trl_ppo.batch_generation = self._timed(generation, lambda *a: "generation")
        # forward() runs the frozen reference under no_grad, and the policy + value training pass with grad.
        trl_ppo.forward = self._timed(
            forward, lambda *a: "train_forward" if torch.is_grad_enabled() else "ref_logprobs"
        )
        trl_ppo.get_reward = self._timed(
            get_reward, lambda model, *a: "reward_model" if model is self.reward_model else "value_inference"
        )

    def _timed(self, fn, label):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[label(*args)] += time.perf_counter() - start

        return wrapper

    def end_step(self) -> None:
        self.steps.append(dict(self.current))
        self.current.clear()


class StepTimes(TrainerCallback):
    """Wall and process-CPU time between consecutive step ends (PPOTrainer's loop fires no on_step_begin)."""

    def __init__(self, clock: PhaseClock):
        self.clock, self.seconds, self.cpu_seconds, self.last = clock, [], [], None

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = (time.perf_counter(), time.process_time())

    def on_step_end(self, args, state, control, **kwargs):
        now = (time.perf_counter(), time.process_time())
        self.seconds.append(now[0] - self.last[0])
        self.cpu_seconds.append(now[1] - self.last[1])
        self.last = now
        self.clock.end_step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts", required=True, help="JSON list of token-id lists, batch × steps of them")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--response-length", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    tokenizer = PreTrainedTokenizerFast.from_pretrained(os.path.join(args.model_dir, "tokenizer"))
    tokenizer.padding_side = "left"  # TRL's queries share one context length
    load = {"dtype": torch.float32, "attn_implementation": "sdpa"}
    policy = AutoModelForCausalLM.from_pretrained(os.path.join(args.model_dir, "policy"), **load)
    value = AutoModelForTokenClassification.from_pretrained(os.path.join(args.model_dir, "value"), **load)
    reward = AutoModelForTokenClassification.from_pretrained(os.path.join(args.model_dir, "value"), **load)
    prompts = json.load(open(args.prompts))
    dataset = Dataset.from_dict({"input_ids": prompts})

    with tempfile.TemporaryDirectory() as out_dir:
        config = PPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=1,
            num_mini_batches=1,
            num_ppo_epochs=1,
            total_episodes=args.batch * args.steps,
            local_rollout_forward_batch_size=args.batch,
            response_length=args.response_length,
            stop_token="eos",
            missing_eos_penalty=None,
            temperature=1.0,
            kl_coef=0.05,
            kl_estimator="k1",
            cliprange=0.2,
            cliprange_value=0.2,
            gamma=1.0,
            lam=0.95,
            learning_rate=1e-4,
            num_sample_generations=0,
            gradient_checkpointing=False,
            bf16=False,
            fp16=False,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
        )
        clock = PhaseClock(reward)
        timer = StepTimes(clock)
        trainer = PPOTrainer(
            args=config,
            processing_class=tokenizer,
            model=policy,
            ref_model=None,
            reward_model=reward,
            train_dataset=dataset,
            value_model=value,
            eval_dataset=dataset.select(range(args.batch)),
            callbacks=[timer],
        )
        trainer.train()

    with open(args.out, "w") as f:
        json.dump(
            {
                "step_seconds": timer.seconds,
                "step_cpu_seconds": timer.cpu_seconds,
                "phases": clock.steps,
                "widths": clock.widths,
                "trl": trl.__version__,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            },
            f,
            indent=2,
        )


if __name__ == "__main__":
    main()
