"""``value.warm_start`` from an exported critic: the weights arrive whole; another architecture, another vocabulary,
a directory without safetensors or a missing path is refused with one line naming the key. (From a dtppo checkpoint:
tests/functional/test_recipes_cli.py.)"""

import json

import pytest
import torch

from dtppo.checkpoint.warm_start import load_warm_start
from dtppo.config import ConfigError, TinyModelConfig, from_dict
from dtppo.errors import InputError
from dtppo.models.causal_lm import tiny_qwen2_config
from dtppo.models.value import ValueModel, build_backbone

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


def _critic(seed: int, vocab: int = 40, tiny: TinyModelConfig = TINY) -> ValueModel:
    backbone = build_backbone(None, tiny_qwen2_config(tiny, vocab, 0, 1), seed=seed)
    return ValueModel(backbone, seed=seed, init_std=0.5)


def test_an_exported_critic_is_loaded_whole(tmp_path):
    source = _critic(seed=1)
    source.save_pretrained(tmp_path / "critic")
    target = _critic(seed=2)
    assert float((target.score.weight - source.score.weight).detach().abs().max()) > 1e-3  # they start apart
    load_warm_start(target, str(tmp_path / "critic"))
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
    ids = torch.randint(2, 40, (2, 7))
    torch.testing.assert_close(target.values(ids, torch.ones_like(ids)), source.values(ids, torch.ones_like(ids)))


@pytest.mark.parametrize(
    "target, expected",
    [
        (lambda: _critic(seed=2, vocab=48), "a vocabulary of 40 tokens, this critic's has 48"),
        (lambda: _critic(seed=2, tiny=TinyModelConfig(**{**TINY.__dict__, "num_layers": 3})), "missing"),
        (lambda: _critic(seed=2, tiny=TinyModelConfig(**{**TINY.__dict__, "intermediate_size": 96})), "is [64, 32]"),
    ],
)
def test_another_architecture_or_vocabulary_is_refused_in_one_line(tmp_path, target, expected):
    _critic(seed=1).save_pretrained(tmp_path / "critic")
    with pytest.raises(InputError) as err:
        load_warm_start(target(), str(tmp_path / "critic"))
    message = str(err.value)
    assert message.startswith("value.warm_start: ") and expected in message and "\n" not in message


def test_unreadable_sources_are_refused(tmp_path):
    (tmp_path / "pickled").mkdir()
    config = {"architectures": ["Qwen2ForTokenClassification"]}
    (tmp_path / "pickled" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="no \\*.safetensors"):
        load_warm_start(_critic(seed=0), str(tmp_path / "pickled"))
    with pytest.raises(InputError, match="no such checkpoint or critic directory"):
        load_warm_start(_critic(seed=0), str(tmp_path / "absent"))


def test_a_warm_start_without_a_critic_is_refused_naming_the_key():
    tree = {"ppo": {"advantage_estimator": "grpo", "num_generations_per_prompt": 2}, "value": {"warm_start": "x"}}
    with pytest.raises(ConfigError, match=r"value\.warm_start"):
        from_dict(tree)
