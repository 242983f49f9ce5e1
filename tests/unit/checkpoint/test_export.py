"""``dtppo export``: a checkpoint written before checkpoints carried ``hf/`` and stored a tied embedding once is
rebuilt from the directories (here: the tiny shapes) its config names, the tied lm_head read from the embedding; a
run whose models came from bf16 directories (a Qwen2 policy, a Gemma 3 critic) exports in bf16 (``export.dtype:
auto``), or in the dtype ``export.dtype`` names."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModel, AutoModelForCausalLM, Qwen2ForCausalLM

from dtppo.checkpoint import store as checkpoint
from dtppo.checkpoint.export import export_checkpoint
from dtppo.cli import main
from dtppo.config import ConfigError, TinyModelConfig
from dtppo.models.causal_lm import build_causal_lm, build_policy, tiny_qwen2_config
from dtppo.models.description import describe_models
from dtppo.models.ties import tied_names, untied
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.value import ValueModel, build_backbone
from tests.support.recipes import tiny_config
from tests.unit.models.test_critic_format import gemma3_config


def test_an_old_checkpoint_without_hf_and_with_both_tied_names_exports(tmp_path):
    cfg = tiny_config("ppo.init_from_sft=false")
    tok = build_char_tokenizer()
    policy = build_causal_lm(None, cfg.policy.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id, seed=5)
    tiny = tiny_qwen2_config(cfg.value.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id)
    critic = ValueModel(build_backbone(None, tiny, seed=6), seed=6)
    state = {"policy": {"model": policy.state_dict()}, "value": {"model": critic.state_dict()}}
    assert "lm_head.weight" in state["policy"]["model"]  # the old layout: every name, tied ones twice
    step_dir = checkpoint.save(tmp_path / "ckpt", 3, state, {}, cfg.to_dict(), keep_last=1)
    assert not (step_dir / checkpoint.HF_DIR).exists()
    export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy")
    for name, tensor in policy.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name
    reloaded = ValueModel.from_pretrained(tmp_path / "hf" / "critic")
    for name, tensor in critic.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def _bf16_sources(tmp_path: Path, tok) -> tuple[Path, Path]:
    """A Qwen2 policy directory and a Gemma 3 text critic directory, both stored in bfloat16, with ``tok``."""
    tiny = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(tiny_qwen2_config(tiny, len(tok), tok.pad_token_id, tok.eos_token_id))
    critic = AutoModel.from_config(gemma3_config(len(tok)))
    for model, directory in ((policy, tmp_path / "policy-src"), (critic, tmp_path / "critic-src")):
        model.to(torch.bfloat16).save_pretrained(directory)
        tok.save_pretrained(directory)
    return tmp_path / "policy-src", tmp_path / "critic-src"


def _checkpoint(tmp_path: Path, *overrides: str):
    """A checkpoint as a run writes it (weights, config, ``hf/`` description) of a bf16-sourced policy and Gemma 3
    critic, trained (loaded) in float32; returns (its directory, the policy, the critic)."""
    tok = build_char_tokenizer()
    policy_dir, critic_dir = _bf16_sources(tmp_path, tok)
    cfg = tiny_config(
        "ppo.init_from_sft=false", f"policy.model.path={policy_dir}", f"value.model.path={critic_dir}", *overrides
    )
    policy = build_policy(cfg.policy_init_path, cfg.policy.model.tiny, cfg.ppo.seed, tok)
    critic = ValueModel(build_backbone(cfg.value_init_path, None, seed=3), seed=3, init_std=0.5)
    assert policy.dtype == critic.backbone.dtype == torch.float32
    state = {
        "policy": {"model": untied(policy.state_dict(), tied_names(policy))},
        "value": {"model": critic.state_dict()},
    }
    hf_files = describe_models(policy, tok, cfg.policy_init_path, cfg.critic_model)
    checkpoint.save(tmp_path / "ckpt", 2, state, {}, cfg.to_dict(), keep_last=1, hf_files=hf_files)
    return tmp_path / "ckpt", policy, critic


def _dtypes_and_bytes(directory: Path) -> tuple[set[str], int]:
    dtypes = set()
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as weights:
            dtypes |= {weights.get_slice(key).get_dtype() for key in weights.keys()}
    return dtypes, sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def test_the_export_is_in_the_source_dtype_unless_export_dtype_says_otherwise(tmp_path):
    ckpt, policy, critic = _checkpoint(tmp_path)
    export_checkpoint(ckpt, tmp_path / "auto")
    export_checkpoint(ckpt, tmp_path / "fp32", ("export.dtype=float32",))
    sizes = {}
    for out, dtype, code in (("auto", "bfloat16", "BF16"), ("fp32", "float32", "F32")):
        for name in ("policy", "critic"):
            assert json.loads((tmp_path / out / name / "config.json").read_text())["dtype"] == dtype, (out, name)
            dtypes, sizes[out, name] = _dtypes_and_bytes(tmp_path / out / name)
            assert dtypes == {code}, (out, name, dtypes)
    for name in ("policy", "critic"):
        assert 0.45 < sizes["auto", name] / sizes["fp32", name] < 0.55, sizes
    assert (tmp_path / "auto" / "critic" / "value_head.safetensors").is_file()  # Gemma 3: base model + head
    # the float32 export is the trained weights, bit for bit; the bf16 one, those weights rounded to bf16
    reloaded = {out: ValueModel.from_pretrained(tmp_path / out / "critic") for out in ("fp32", "auto")}
    weights, trained = reloaded["fp32"].state_dict(), critic.state_dict()
    assert weights.keys() == trained.keys() and all(torch.equal(weights[k], trained[k]) for k in trained)
    ids = torch.randint(3, 90, (2, 12))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        # values to the parity tolerance only: the reloaded model attends with transformers' sdpa, the trained one
        # with dtppo's kernel, whose sums differ in order (up to 2.5e-6 on values of magnitude 6, AMD EPYC)
        for out, tolerance in (("fp32", 1e-5), ("auto", 0.1)):
            assert (reloaded[out].values(ids, mask) - critic.values(ids, mask)).abs().max() <= tolerance, out
        exported = AutoModelForCausalLM.from_pretrained(tmp_path / "auto" / "policy")
        for name, tensor in policy.state_dict().items():
            assert torch.equal(exported.state_dict()[name], tensor.to(torch.bfloat16)), name


def test_export_dtype_in_the_recipe_and_refused_overrides(tmp_path, capsys):
    ckpt, _, _ = _checkpoint(tmp_path, "export.dtype=float16")
    export_checkpoint(ckpt, tmp_path / "hf")
    assert _dtypes_and_bytes(tmp_path / "hf" / "critic")[0] == {"F16"}
    with pytest.raises(ConfigError, match=r"^ppo\.seed: dtppo export takes export\.\* keys only"):
        export_checkpoint(ckpt, tmp_path / "other", ("ppo.seed=3",))
    with pytest.raises(
        ConfigError, match=r"^export\.dtype: must be one of \['auto', 'float32', 'bfloat16', 'float16'\]"
    ):
        export_checkpoint(ckpt, tmp_path / "other", ("export.dtype=fp8",))
    capsys.readouterr()  # what building the checkpoint printed
    with pytest.raises(SystemExit) as stopped:  # the command: one line, exit 2, as a recipe's config error
        main(["export", str(ckpt), str(tmp_path / "other"), "export.dtype=fp8"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "dtppo: config error: export.dtype: must be one of ['auto', 'float32', 'bfloat16', 'float16'], got 'fp8'\n"
    )
