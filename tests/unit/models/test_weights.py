"""A trained model's weights as a generator loads them (``dtppo.models.weights``): plain HF names, each tied parameter
named once in the message's list but sent under each of its names, loaded into another model exactly, and a name too
many or too few refused. Adapters merged: tests/unit/models/test_lora.py."""

import pytest
import torch

from dtppo.config import TinyModelConfig
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.weights import full_parameters, load_weights, plain_name, weight_names

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)


def _model(seed: int):
    return build_causal_lm(None, TINY, 40, 0, 1, seed=seed)


def test_plain_names_drop_the_adapters_layer_and_its_own_tensors():
    assert plain_name("model.layers.0.self_attn.q_proj.base_layer.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert plain_name("model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert plain_name("model.norm.weight") == "model.norm.weight"


def test_the_names_list_each_tied_parameter_once_and_the_weights_come_under_every_name():
    model = _model(0)
    names = weight_names(model)
    assert names == [name for name, _ in model.named_parameters()] and "lm_head.weight" not in names
    sent = dict(full_parameters(model, torch.device("cpu")))
    assert set(sent) == set(names) | {"lm_head.weight"}
    assert torch.equal(sent["lm_head.weight"], sent["model.embed_tokens.weight"])


def test_weights_load_into_another_model_exactly():
    trained, served = _model(0), _model(1)
    assert not torch.equal(trained.model.embed_tokens.weight, served.model.embed_tokens.weight)
    load_weights(served, full_parameters(trained, torch.device("cpu")))
    for (name, a), (_, b) in zip(trained.state_dict().items(), served.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_name_the_model_lacks_or_a_parameter_left_out_is_refused():
    model = _model(0)
    weights = list(full_parameters(model, torch.device("cpu")))
    with pytest.raises(ValueError, match="weights for extra.weight, which the generator's model does not have"):
        load_weights(_model(1), [*weights, ("extra.weight", torch.zeros(1))])
    with pytest.raises(
        ValueError, match=r"no weights for 1 parameters of the generator's model: \['model.norm.weight'\]"
    ):
        load_weights(_model(1), [(n, t) for n, t in weights if n != "model.norm.weight"])
