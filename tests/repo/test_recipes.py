"""The recipes the repository ships: each loads and passes preflight, and the reference and task recipes hold the
settings they state."""

import pytest

from dtppo import config as config_lib
from dtppo.launch.preflight import preflight
from tests.support.recipes import REPO

RECIPES = sorted(f"recipes/{p.name}" for p in (REPO / "recipes").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _cwd(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_loads(recipe):
    cfg = config_lib.load(recipe)
    if cfg.data.task == "gsm8k":  # a recipe that reads GSM8K from the hub: checked offline with the rows tests ship
        local = [
            f"data.{split}.{key}"
            for split, name in (("train", "train"), ("validation", "test"))
            for key in (f"path=tests/data/gsm8k/{name}.jsonl", "hf_config=null", "split=null")
        ]
        cfg = config_lib.load(recipe, local)
    preflight(cfg)  # the GPU recipes need vllm installed (CI's .venv has the CPU build)
    assert cfg.ppo.max_num_steps >= 1


def test_gpu_recipe_mirrors_reference():
    cfg = config_lib.load("recipes/qwen2.5-1.5b-gsm8k-1n8g.yaml")
    assert cfg.policy.optimizer.lr == 1e-6 and cfg.value.optimizer.lr == 1e-5
    assert cfg.ppo.num_prompts_per_step == 1024 and cfg.ppo.num_generations_per_prompt == 1
    assert cfg.policy.train_global_batch_size == 256 and cfg.ppo.ppo_epochs == 1
    assert (cfg.ppo.gae.gamma, cfg.ppo.gae.lambda_value, cfg.ppo.gae.lambda_policy) == (1.0, 1.0, 1.0)
    assert cfg.loss.value_clip == 0.5 and cfg.ppo.normalize_advantages and cfg.loss.kl.coef == 0.0
    assert (cfg.loss.ratio_clip_low, cfg.loss.ratio_clip_high, cfg.loss.ratio_clip_c) == (0.2, 0.2, 3.0)
    assert cfg.policy.generation.max_new_tokens == 512 and cfg.policy.generation.temperature == 1.0
    assert cfg.policy.generation.backend == "vllm"
    assert (
        cfg.ppo.validation.period == 1 and cfg.ppo.validation.max_samples == 256 and cfg.checkpointing.save_period == 10
    )


def test_the_mixed_recipe_puts_half_the_problems_out_of_reach():
    cfg = config_lib.load("recipes/tiny-math-mixed-cpu.yaml")  # the task where a critic learns
    assert cfg.data.tiny_math.hard_fraction == 0.5 and cfg.data.tiny_math.hard_max_number == 999


def test_math_recipe_reads_math_rows_with_the_math_verifier():
    cfg = config_lib.load("recipes/qwen2.5-1.5b-math-1n8g.yaml")
    assert cfg.data.task == "math" and cfg.data.train.split == "train" and cfg.data.validation.split == "test"
    assert (cfg.reward.functions, cfg.reward.weights, cfg.reward.accuracy_from) == (("math",), (1.0,), "math")
    assert "\\boxed{}" in cfg.data.system_prompt and cfg.policy.optimizer.lr == 1e-6  # the GSM8K recipe's settings


def test_the_long_recipe_fits_its_longest_answers_and_splits_rows_over_two_ranks():
    from dtppo.data.chat import encode_prompts
    from dtppo.data.loader import build_sources
    from dtppo.models.tokenizer import build_char_tokenizer

    cfg = config_lib.load("recipes/tiny-long-cpu.yaml")
    assert cfg.policy.parallel.cp == cfg.value.parallel.cp == cfg.cluster.workers_per_node == 2
    tokenizer = build_char_tokenizer()
    source, validation = build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples, tokenizer=tokenizer)
    problems = [source[i] for i in range(300)] + validation
    prompts = encode_prompts(tokenizer, problems, cfg.data)
    answers = tokenizer([p.solution for p in problems], add_special_tokens=False)["input_ids"]
    lengths = [len(a) + 1 for a in answers]  # + EOS
    assert 600 < min(lengths) and 1000 < sum(lengths) / len(lengths) and max(lengths) <= 1400
    assert max(lengths) <= cfg.policy.generation.max_new_tokens  # no correct answer is cut
    longest = max(len(p) for p in prompts) + cfg.policy.generation.max_new_tokens
    assert longest <= cfg.policy.model.tiny.max_position_embeddings
