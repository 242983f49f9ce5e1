"""The reward's sections (``dtppo.config.reward``): the functions' bounds, the reward model and the process reward
model refuse a bad value naming its key; a process reward model alone is a custom task's reward."""

from __future__ import annotations

import pytest

from dtppo.testing.configs import tiny_config
from tests.support.bad_configs import assert_refused, ids

PRM = "reward.process_model"
CAUSAL = [f"{PRM}.path=prm", f"{PRM}.head=causal_lm"]
BAD = [
    ("range", ["reward.timeout_s=0"], "reward.timeout_s"),
    ("range", ["reward.timeout_s=.inf"], "reward.timeout_s"),
    ("range", ["reward.model.batch_size=0"], "reward.model.batch_size"),
    ("range", [f"{PRM}.max_length=0"], f"{PRM}.max_length"),
    ("range", [f"{PRM}.weight=.nan"], f"{PRM}.weight"),
    ("bad choice", [f"{PRM}.head=regression"], f"{PRM}.head"),
    ("empty", [f"{PRM}.separator=''"], f"{PRM}.separator"),
    ("empty", [f"{PRM}.step_tag=''"], f"{PRM}.step_tag"),
    ("missing", CAUSAL, f"{PRM}.step_tag"),
    ("missing", [*CAUSAL, f"{PRM}.step_tag=' ки'", f"{PRM}.good_token=+"], f"{PRM}.bad_token"),
    ("same", [*CAUSAL, f"{PRM}.step_tag=' ки'", f"{PRM}.good_token=+", f"{PRM}.bad_token=+"], f"{PRM}.bad_token"),
    ("unused", [f"{PRM}.good_token=+"], f"{PRM}.good_token"),
    ("reserved", ["reward.functions=[gsm8k, my.module:process_model]"], "reward.functions[1]"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)


def test_a_process_reward_model_alone_rewards_a_custom_task(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "q"}\n')
    custom = ["data.task=custom", f"data.train.path={rows}", f"data.validation.path={rows}", "reward.functions=[]"]
    cfg = tiny_config(*custom, f"{PRM}.path=prm", f"{PRM}.separator='. '")
    # without it nothing rewards, which the run refuses when it is made (tests/unit/launch/test_preflight.py)
    assert cfg.reward.process_model.separator == ". " and cfg.reward.functions == ()
