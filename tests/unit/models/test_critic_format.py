"""The critic's export layouts (``models.critic_format``): a family transformers has a token-classification class for
keeps that layout; any other (Gemma 3 here) is written as the base model plus ``value_head.safetensors``, which
``ValueModel.from_pretrained``, ``value.warm_start``, ``value.model.path`` and the plain ``transformers`` +
``safetensors`` recipe of docs/guides/usage.md all read back to the same values."""

import json
import re

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForTokenClassification, Gemma3TextConfig, GPT2Config, Qwen2Config
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from dtppo.checkpoint.warm_start import load_warm_start
from dtppo.errors import InputError
from dtppo.models.critic_format import (
    BASE_MODEL_AND_HEAD,
    MARKER_FILE,
    TOKEN_CLASSIFICATION,
    export_layout,
    export_refusal,
)
from dtppo.models.value import ValueModel, build_backbone
from tests.support.recipes import REPO

VOCAB, ROWS = 64, 12


def gemma3_config(vocab: int = VOCAB) -> Gemma3TextConfig:
    """A small Gemma 3 text model whose sliding window (4) is shorter than the test rows (12 tokens)."""
    return Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=64,
    )


def qwen2_config() -> Qwen2Config:
    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )


def gpt2_config() -> GPT2Config:
    return GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=1)


def critic(config, seed: int) -> ValueModel:
    """A critic as a run builds it (``build_backbone``), with a non-trivial head (bias != 0)."""
    model = ValueModel(build_backbone(None, config, seed=seed), seed=seed, init_std=0.5).eval()
    with torch.no_grad():
        model.score.bias.fill_(0.25 * seed)
    return model


def rows(seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [3, ROWS] and attention_mask [3, ROWS] (one row left-padded by 3)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (3, ROWS), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return ids, mask


def usage_recipe() -> str:
    """The plain-transformers recipe as docs/guides/usage.md prints it: the python block of its "Exports" section."""
    section = (REPO / "docs" / "guides" / "usage.md").read_text().split("\n## Exports\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_recipe(critic_dir, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    namespace = {"critic_dir": str(critic_dir), "input_ids": ids, "attention_mask": mask}
    exec(usage_recipe(), namespace)  # the documented code, verbatim
    return namespace["values"]


def test_a_gemma3_critic_exports_as_base_model_and_head_and_reloads_three_ways(tmp_path):
    source = critic(gemma3_config(), seed=1)
    source.save_pretrained(tmp_path / "critic")
    files = sorted(p.name for p in (tmp_path / "critic").iterdir())
    assert files == ["config.json", "model.safetensors", "value_head.json", "value_head.safetensors"]
    config = json.loads((tmp_path / "critic" / "config.json").read_text())
    assert config["architectures"] == ["Gemma3TextModel"] and config["dtype"] == "float32"
    assert json.loads((tmp_path / "critic" / MARKER_FILE).read_text())["layout"] == BASE_MODEL_AND_HEAD
    with safe_open(str(tmp_path / "critic" / "value_head.safetensors"), framework="pt") as head:
        assert {name: head.get_slice(name).get_shape() for name in head.keys()} == {
            "score.weight": [1, 64],
            "score.bias": [1],
        }
    ids, mask = rows()
    with torch.no_grad():
        expected_head, expected = source(ids, mask), source.values(ids, mask)
        # 1. ValueModel.from_pretrained
        loaded = ValueModel.from_pretrained(tmp_path / "critic").eval()
        assert (loaded.values(ids, mask) - expected).abs().max() <= 1e-6
        # 2. value.warm_start, into a critic of the run's build that starts elsewhere
        target = critic(gemma3_config(), seed=2)
        assert (target.values(ids, mask) - expected).abs().max() > 1e-2
        load_warm_start(target, str(tmp_path / "critic"))
        assert (target.values(ids, mask) - expected).abs().max() <= 1e-6
        # 3. transformers + safetensors alone, the recipe in docs/guides/usage.md
        assert (run_recipe(tmp_path / "critic", ids, mask) - expected_head).abs().max() <= 1e-6
    # value.model.path: the directory is the critic's backbone
    backbone = build_backbone(str(tmp_path / "critic"))
    assert all(torch.equal(backbone.state_dict()[k], v) for k, v in source.backbone.state_dict().items())


def test_the_recipe_tells_two_critics_apart(tmp_path):
    # negative control: the documented recipe on another critic's export does not give the first critic's values
    critic(gemma3_config(), seed=1).save_pretrained(tmp_path / "one")
    other = critic(gemma3_config(), seed=3)
    other.save_pretrained(tmp_path / "other")
    ids, mask = rows()
    with torch.no_grad():
        assert (run_recipe(tmp_path / "one", ids, mask) - other(ids, mask)).abs().max() > 1e-2


@pytest.mark.parametrize("config", [qwen2_config, gpt2_config], ids=["qwen2", "gpt2"])
def test_a_family_with_a_token_classification_class_keeps_that_layout(tmp_path, config):
    # GPT-2's class names its head `classifier`, not `score`: it is found by shape, and exports too
    source = critic(config(), seed=1)
    source.save_pretrained(tmp_path / "critic")
    assert sorted(p.name for p in (tmp_path / "critic").iterdir()) == ["config.json", "model.safetensors"]
    architecture = json.loads((tmp_path / "critic" / "config.json").read_text())["architectures"]
    assert architecture == [f"{type(source.backbone).__name__.removesuffix('Model')}ForTokenClassification"]
    ids, mask = rows()
    with torch.no_grad():
        hf = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic").eval()
        assert (hf(input_ids=ids, attention_mask=mask).logits.squeeze(-1) - source(ids, mask)).abs().max() <= 1e-6
        loaded = ValueModel.from_pretrained(tmp_path / "critic")
        assert (loaded.values(ids, mask) - source.values(ids, mask)).abs().max() <= 1e-6


@pytest.mark.parametrize("config", [qwen2_config, gemma3_config], ids=["token-classification", "base-model"])
def test_a_critic_is_written_in_the_dtype_asked_and_left_as_it_is(tmp_path, config):
    source = critic(config(), seed=1)
    before = {k: v.clone() for k, v in source.state_dict().items()}
    source.save_pretrained(tmp_path / "fp32")
    source.save_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    assert all(torch.equal(source.state_dict()[k], v) for k, v in before.items())  # not cast in place
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    sizes = {}
    for name in ("fp32", "bf16"):
        for file in (tmp_path / name).glob("*.safetensors"):
            with safe_open(str(file), framework="pt") as weights:
                dtypes = {weights.get_slice(key).get_dtype() for key in weights.keys()}
            assert dtypes == {"F32" if name == "fp32" else "BF16"}, (file, dtypes)
        sizes[name] = sum(f.stat().st_size for f in (tmp_path / name).glob("*.safetensors"))
    assert 0.45 < sizes["bf16"] / sizes["fp32"] < 0.55, sizes
    ids, mask = rows()
    with torch.no_grad():
        rounded = ValueModel.from_pretrained(tmp_path / "bf16").values(ids, mask)
        assert 1e-6 < (rounded - source.values(ids, mask)).abs().max() < 0.1  # bf16 weights: close, not equal


@pytest.mark.parametrize(
    "model_type, layout",
    [
        ("qwen2", TOKEN_CLASSIFICATION),
        ("qwen3", TOKEN_CLASSIFICATION),
        ("llama", TOKEN_CLASSIFICATION),
        ("mistral", TOKEN_CLASSIFICATION),
        ("gemma2", TOKEN_CLASSIFICATION),
        ("gpt2", TOKEN_CLASSIFICATION),
        ("gemma3_text", BASE_MODEL_AND_HEAD),
        ("olmo2", BASE_MODEL_AND_HEAD),
        ("granite", BASE_MODEL_AND_HEAD),
        ("cohere", BASE_MODEL_AND_HEAD),
    ],
)
def test_each_family_gets_its_layout_from_a_meta_build(model_type, layout):
    config = CONFIG_MAPPING[model_type]()  # the family's full-size defaults: built on the meta device only
    assert export_refusal(config) is None
    assert export_layout(config) == layout


def test_a_critic_no_layout_can_write_is_named():
    composite = CONFIG_MAPPING["gemma3"]()  # Gemma 3's multimodal config: its base model has no hidden_size
    assert "has no hidden_size for the value head" in export_refusal(composite)
    assistant = CONFIG_MAPPING["gemma4_assistant"]()  # a causal LM without a base model class
    assert export_refusal(assistant) == "transformers has no base model class (AutoModel) for gemma4_assistant"


def test_an_unknown_layout_and_a_pickled_backbone_are_refused(tmp_path):
    critic(gemma3_config(), seed=1).save_pretrained(tmp_path / "critic")
    marker = tmp_path / "critic" / MARKER_FILE
    marker.write_text(json.dumps({"layout": "something-else"}))
    with pytest.raises(InputError, match="an unknown critic layout 'something-else'"):
        ValueModel.from_pretrained(tmp_path / "critic")
    marker.write_text(json.dumps({"layout": BASE_MODEL_AND_HEAD}))
    weights = tmp_path / "critic" / "model.safetensors"
    weights.rename(tmp_path / "critic" / "pytorch_model.bin")  # a .bin beside the head: never unpickled
    with pytest.raises(InputError, match="cannot load a model or tokenizer from it"):
        ValueModel.from_pretrained(tmp_path / "critic")
