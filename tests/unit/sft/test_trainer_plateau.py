"""SFT to its plateau and the floor PPO's recipes state: the stopping rule, the one-line refusal, the saved results."""

import json

import pytest

from dtppo import config as config_lib
from dtppo.errors import BelowFloorError, InputError
from dtppo.sft.trainer import RESULTS_FILE, Plateau, check_floor, saved_results
from tests.support.recipes import REPO

RECIPES = REPO / "recipes"
DEMO = RECIPES / "tiny-math-critic-cpu.yaml"


def _run(accuracies, patience, min_improvement=0.01, floor=0.0):
    """Judge one validation per accuracy (every 100 steps) until the rule stops; the steps validated."""
    plateau = Plateau(patience=patience, min_improvement=min_improvement, floor=floor)
    steps = []
    for i, accuracy in enumerate(accuracies):
        plateau.judge(accuracy)
        steps.append(100 * (i + 1))
        if plateau.reached:
            break
    return steps, plateau


def test_plateau_stops_after_patience_validations_without_a_real_gain():
    # gains of 0.2, 0.3, then +0.005 (below min_improvement 0.01) and -0.02: two stale validations
    steps, plateau = _run([0.2, 0.5, 0.505, 0.485, 0.9], patience=2)
    assert steps == [100, 200, 300, 400]
    assert plateau.best == pytest.approx(0.505) and plateau.stale == 2


def test_a_real_gain_resets_the_count():
    steps, _ = _run([0.2, 0.2, 0.4, 0.4, 0.4], patience=2)  # stale, gain (reset), stale, stale
    assert steps == [100, 200, 300, 400, 500]


def test_a_low_plateau_below_the_floor_is_not_the_end():
    # The tiny model's measured shape (docs/guides/learning.md): ~12 % for hundreds of steps (format learned, arithmetic
    # not), then the climb. Below the floor nothing counts as stale; from 0.98 on it does.
    curve = [0.121, 0.129, 0.070, 0.129, 0.449, 0.695, 0.980, 0.922, 0.984, 0.5]
    steps, plateau = _run(curve, patience=2, floor=0.9)
    assert steps == [100 * i for i in range(1, 10)] and plateau.best == pytest.approx(0.984)
    early, _ = _run(curve, patience=2, floor=0.0)  # the negative control: without the floor it stops at 12 %
    assert early == [100, 200, 300]


def test_patience_zero_never_stops():
    steps, plateau = _run([0.5] * 6, patience=0)
    assert steps == [100 * i for i in range(1, 7)] and not plateau.reached


def test_the_demo_recipe_states_a_floor_and_refuses_a_model_below_it_in_one_line():
    cfg = config_lib.load(DEMO)
    floor = cfg.sft.min_accuracy
    assert floor > 0.5  # the recipe states a floor a converged SFT model clears
    with pytest.raises(BelowFloorError) as err:
        check_floor({"sft/accuracy": 0.176, "sft/steps": 400.0}, cfg)
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 5
    assert message.startswith("sft.min_accuracy:") and "17.6 %" in message and f"{100 * floor:.1f} %" in message
    assert "after 400 steps" in message and cfg.sft.output_dir in message
    check_floor({"sft/accuracy": floor}, cfg)  # at the floor: accepted
    check_floor({}, cfg)  # a model dtppo did not train carries no results: nothing to check


def test_a_floor_of_zero_accepts_any_model():
    check_floor({"sft/accuracy": 0.0}, config_lib.load(DEMO, ["sft.min_accuracy=0"]))


def test_saved_results_read_back_and_refuse_a_bad_file(tmp_path):
    cfg = config_lib.load(DEMO, [f"sft.output_dir={tmp_path}"])
    assert saved_results(cfg) == {}
    (tmp_path / RESULTS_FILE).write_text(json.dumps({"sft/accuracy": 0.9, "sft/steps": 800}))
    assert saved_results(cfg) == {"sft/accuracy": 0.9, "sft/steps": 800.0}
    (tmp_path / RESULTS_FILE).write_text(json.dumps({"sft/accuracy": "high"}))
    with pytest.raises(InputError, match="not a JSON object of numbers"):
        saved_results(cfg)
    (tmp_path / RESULTS_FILE).write_text("{")
    with pytest.raises(InputError, match="unreadable"):
        saved_results(cfg)


@pytest.mark.parametrize(
    "override, key",
    [
        ("sft.patience=2", "sft.patience"),
        ("sft.val_period=-1", "sft.val_period"),
        ("sft.min_accuracy=1.5", "sft.min_accuracy"),
    ],
)
def test_bad_plateau_settings_are_config_errors(override, key):
    overrides = [override] if override != "sft.patience=2" else [override, "sft.val_period=0"]
    with pytest.raises(config_lib.ConfigError, match=rf"^{key}:"):
        config_lib.load(RECIPES / "base.yaml", overrides)
