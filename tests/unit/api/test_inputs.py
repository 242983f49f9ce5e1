"""What ``PPOTrainer``'s arguments become (``dtppo.api.inputs``): reward functions named in ``reward.functions``
beside their callables, datasets as rows; every misuse one ``ConfigError`` naming the argument."""

import datasets
import pytest

from dtppo.api.inputs import given_inputs
from dtppo.config import ConfigError
from tests.support.recipes import tiny_config


def correctness(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def test_callables_are_named_by_name_lambdas_by_place_and_strings_stay_specs():
    offset = 0.5
    cfg, given = given_inputs(
        tiny_config(), [correctness, "gsm8k", lambda completions, **kw: [offset] * len(completions)], None, None
    )
    assert cfg.reward.functions == ("correctness", "gsm8k", "reward_2")
    assert cfg.reward.weights == (1.0, 1.0, 1.0)  # TRL's default: the recipe's one weight was for one function
    assert [name for name, _ in given.functions] == ["correctness", "reward_2"]
    assert given.function("reward_2")(completions=["a"]) == [0.5]


def test_a_mapping_names_its_functions_and_keeps_weights_of_the_same_count():
    cfg, given = given_inputs(tiny_config("reward.weights=[2.0]"), {"mine": correctness}, None, None)
    assert cfg.reward.functions == ("mine",) and cfg.reward.weights == (2.0,)
    assert given.function("mine") is correctness


def test_a_single_callable_is_a_list_of_one():
    cfg, _ = given_inputs(tiny_config(), correctness, None, None)
    assert cfg.reward.functions == ("correctness",)


def test_the_same_name_twice_gets_the_second_its_place():
    def twin(completions, **kwargs):
        return [0.0] * len(completions)

    other = twin
    cfg, given = given_inputs(tiny_config(), [twin, other], None, None)
    assert cfg.reward.functions == ("twin", "twin_1")


@pytest.mark.parametrize(
    "reward_funcs, fragment",
    [
        ([42], "reward_funcs[0]: 42 is neither a callable nor a reward function's spec"),
        ({"gsm8k": correctness}, "reward_funcs[0]: the name 'gsm8k' is taken"),
        ({"model": correctness}, "reward_funcs[0]: the name 'model' is taken"),
        ({"not a name": correctness}, "reward_funcs: 'not a name' is not a Python name"),
        (["gsm9k:"], "reward.functions[0]:"),
    ],
)
def test_misuse_is_one_config_error(reward_funcs, fragment):
    with pytest.raises(ConfigError) as err:
        given_inputs(tiny_config(), reward_funcs, None, None)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_datasets_pass_as_they_are_and_lists_as_dicts():
    rows = [{"prompt": "2+2?", "answer": "4", "topic": "sums"}]
    dataset = datasets.Dataset.from_list(rows)
    _, given = given_inputs(tiny_config(), None, dataset, rows)
    assert given.train_rows is dataset and given.validation_rows == rows
    assert given.functions == ()


@pytest.mark.parametrize(
    "dataset, fragment",
    [
        (datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "p"}])}), "a DatasetDict holds"),
        ("data/train.jsonl", "expected a datasets.Dataset or a list of dicts, got str"),
        ([1, 2], "expected a datasets.Dataset or a list of dicts, got list"),
        ([], "train_dataset: no rows"),
    ],
)
def test_a_dataset_that_is_not_rows_is_refused(dataset, fragment):
    with pytest.raises(ConfigError, match="^train_dataset: ") as err:
        given_inputs(tiny_config(), None, dataset, None)
    assert fragment in str(err.value)
