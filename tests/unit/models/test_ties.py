"""Tied parameters (``dtppo.models.ties``): every alias of a parameter reachable under several names, mapped to its
first name, and a state without the aliases (what a checkpoint stores once)."""

import torch
from torch import nn

from dtppo.config import TinyModelConfig
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.ties import tied_names, untied

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)


def test_the_tiny_policys_head_is_its_embedding():
    model = build_causal_lm(None, TINY, 40, 0, 1, seed=0)
    assert tied_names(model) == {"lm_head.weight": "model.embed_tokens.weight"}
    state = model.state_dict()
    kept = untied(state, tied_names(model))
    assert (
        set(state) - set(kept) == {"lm_head.weight"}
        and kept["model.embed_tokens.weight"] is state["model.embed_tokens.weight"]
    )


def test_an_untied_model_has_no_aliases_and_a_shared_module_counts_each_parameter():
    assert tied_names(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) == {}
    shared = nn.Linear(2, 2)
    model = nn.ModuleDict({"a": shared, "b": nn.Linear(2, 2), "c": shared})
    assert tied_names(model) == {"c.weight": "a.weight", "c.bias": "a.bias"}
    assert untied({"a.weight": 1, "c.weight": 1, "b.bias": 2}, tied_names(model)) == {"a.weight": 1, "b.bias": 2}


def test_equal_values_are_not_ties():
    model = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    with torch.no_grad():
        model["b"].weight.copy_(model["a"].weight)
    assert tied_names(model) == {}
