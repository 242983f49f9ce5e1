"""The tiny recipe's PPO must lift validation accuracy well above its starting point.

Setting (measured first, see docs/learning.md): the tiny-math task narrowed to one operation on numbers up to
10, 450 clean SFT steps (~65% greedy accuracy), then the 40-step careless stage that plants bare wrong
`#### N` answers (accuracy falls to ~3%). PPO removes the shortcut within ~5 steps.
Measured (validation accuracy at steps 0/5/10/15/20): seed 0: .027/.512/.488/.488/.566; seed 1:
.027/.453/.457/.492/.484; policy-loss sign flipped: .027/.039/.027/.035/.023. The threshold, a 25-point lift
of the mean of steps 15 and 20 over step 0, passes both seeds by ~20 points and fails the flipped sign.
"""

from conftest import TINY, read_jsonl, run_cli

EASY = ["data.tiny_math.max_number=10", "data.tiny_math.max_ops=1", "logger.tensorboard=false",
        "checkpointing.enabled=false"]


def test_ppo_recovers_accuracy_from_the_planted_shortcut(tmp_path):
    run_cli(["ppo", TINY, *EASY, "sft.num_steps=450", "sft.careless_stage.num_steps=40",
             "sft.output_dir=sft", "ppo.max_num_steps=20", "ppo.val_period=5", "logger.log_dir=ppo"], tmp_path)
    sft = read_jsonl(tmp_path / "sft_logs" / "metrics.jsonl")[-1]
    assert sft["sft/accuracy"] > 0.4  # clean SFT learned the task
    assert sft["sft/accuracy_after_careless_stage"] < 0.15  # the shortcut is planted
    val = {r["step"]: r["validation/accuracy"] for r in read_jsonl(tmp_path / "ppo" / "metrics.jsonl")
           if "validation/accuracy" in r}
    start, late = val[0], (val[15] + val[20]) / 2
    assert late - start > 0.25, val
