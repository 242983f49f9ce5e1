"""What a checkpoint says about its models besides their weights (``dtppo.models.description``): the policy's config
(with its source's dtype), generation config and tokenizer, and the critic backbone's config, as files, nothing
pickled; the models rebuilt from them alone; and the stored dtype a model directory names. Exporting a checkpoint
with them: tests/unit/checkpoint/test_export.py."""

import json
from pathlib import Path

from dtppo.config import ModelConfig, TinyModelConfig
from dtppo.models.causal_lm import build_policy
from dtppo.models.description import CRITIC, POLICY, build_described, describe_models, described, stored_dtype
from dtppo.models.tokenizer import build_char_tokenizer

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)
CRITIC_TINY = TinyModelConfig(hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=32)


def _write(files: dict[str, bytes], root: Path) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_the_description_is_json_and_tokenizer_files_and_rebuilds_both_models(tmp_path):
    tok = build_char_tokenizer()
    policy = build_policy(None, TINY, 0, tok)
    files = describe_models(policy, tok, None, ModelConfig(tiny=CRITIC_TINY))
    assert {f"{POLICY}/config.json", f"{POLICY}/generation_config.json", f"{CRITIC}/config.json"} <= set(files)
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    assert json.loads(files[f"{POLICY}/config.json"])["dtype"] == "float32"  # built from its config
    hf = _write(files, tmp_path / "hf")
    assert described(hf) and not described(tmp_path)
    tokenizer, rebuilt, backbone = build_described(hf)
    assert tokenizer.get_vocab() == tok.get_vocab()
    assert rebuilt.config.hidden_size == 32 and rebuilt.config.vocab_size == len(tok)
    assert [n for n, _ in rebuilt.named_parameters()] == [n for n, _ in policy.named_parameters()]
    assert (backbone.config.hidden_size, backbone.config.num_hidden_layers) == (16, 2)


def test_a_run_without_a_critic_describes_the_policy_only(tmp_path):
    tok = build_char_tokenizer()
    files = describe_models(build_policy(None, TINY, 0, tok), tok, None, None)
    assert not any(name.startswith(f"{CRITIC}/") for name in files)
    assert build_described(_write(files, tmp_path))[2] is None


def test_the_stored_dtype_is_what_the_directorys_config_names_among_the_export_dtypes(tmp_path):
    assert stored_dtype(None) == "float32"
    for named, dtype in [("bfloat16", "bfloat16"), ("float16", "float16"), ("float64", "float32"), (None, "float32")]:
        directory = tmp_path / str(named)
        directory.mkdir()
        config = {"model_type": "qwen2"} | ({"torch_dtype": named} if named else {})  # before transformers 5
        (directory / "config.json").write_text(json.dumps(config))
        assert stored_dtype(directory) == dtype, named
