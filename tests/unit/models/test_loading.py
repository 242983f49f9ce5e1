"""Loading models safely (``dtppo.models.loading``): a failure of ``from_pretrained`` is one line naming the path,
weights not in safetensors are refused before anything is read (a pickle could run code), and dropout is off
everywhere a model has it (PPO's ratio compares two passes of the same policy)."""

import pytest
from torch import nn
from transformers import AutoConfig, GPT2Config, GPT2LMHeadModel

from dtppo.errors import InputError
from dtppo.models.loading import disable_dropout, loading_from, weights_refusal


def test_a_failed_load_is_one_line_naming_the_path(tmp_path):
    with pytest.raises(InputError, match=rf"^{tmp_path}: cannot load a model or tokenizer from it: \w+Error: ") as err:
        with loading_from(str(tmp_path)):
            AutoConfig.from_pretrained(str(tmp_path))  # no config.json
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match=r"x: cannot load a model or tokenizer from it: KeyError: 'first'$"):
        with loading_from("x"):
            raise KeyError("first")


def test_only_safetensors_weights_are_read(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    refusal = weights_refusal(tmp_path, "a reward model")
    assert "found: pytorch_model.bin" in refusal and "a reward model is loaded from safetensors only" in refusal
    assert "found: no weights" in weights_refusal(tmp_path / "empty_dir_missing", "the policy")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert weights_refusal(tmp_path, "a reward model") is None


def test_dropout_is_off_in_every_module_and_attention_rate():
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=40))
    rates = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    assert rates and all(p == 0.1 for p in rates)
    assert disable_dropout(model) is model
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, nn.Dropout))

    class Attention(nn.Module):
        attention_dropout = 0.2

    attention = Attention()
    disable_dropout(nn.Sequential(attention))
    assert attention.attention_dropout == 0.0
