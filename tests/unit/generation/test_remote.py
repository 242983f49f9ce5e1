"""The pieces of generation on ranks of its own that need no second process: the weight message's layout (each tied
parameter once, the trainer's full state dict flattened in the generation side's order, loaded back exactly), and the
rows gathered from several generation ranks. The prompt queue that draws batches ahead of their step:
tests/unit/ppo/test_rollouts.py."""

import torch

from dtppo.config import LoraConfig
from dtppo.generation.remote import flatten_weights
from dtppo.models.causal_lm import build_policy
from dtppo.models.lora import add_adapters
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.weights import full_parameters, weight_names
from dtppo.types import Experience, concat_rows
from tests.support.recipes import tiny_config

SMALL = ["policy.model.tiny.hidden_size=32", "policy.model.tiny.num_layers=1", "policy.model.tiny.intermediate_size=64"]


def _policy(seed: int):
    cfg = tiny_config(*SMALL, "ppo.init_from_sft=false", f"ppo.seed={seed}")
    return build_policy(cfg.policy_init_path, cfg.policy.model.tiny, cfg.ppo.seed, build_char_tokenizer())


def test_a_weight_message_carries_each_parameter_once_and_loads_back_exactly(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    trained, served = _policy(0), _policy(1)
    names = weight_names(trained)
    assert names == weight_names(served)
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied: sent once
    state = trained.state_dict()
    flat = flatten_weights(state, names)
    assert flat.numel() == sum(p.numel() for p in trained.parameters()) and flat.dtype == torch.float32
    params, offset = dict(served.named_parameters()), 0
    with torch.no_grad():
        for name in names:  # what GenerationService._load_weights does
            params[name].copy_(flat[offset : offset + params[name].numel()].view_as(params[name]))
            offset += params[name].numel()
    for name, tensor in served.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    assert served.lm_head.weight.data_ptr() == served.model.embed_tokens.weight.data_ptr()  # still tied


def test_an_adapted_policy_sends_its_merged_weights_under_the_plain_names(repo_root, monkeypatch):
    """LoRA (docs/guides/lora.md): the trainer's model has adapters, a generation rank's has none; the message carries
    the adapters merged into their layers' weights, in the generation side's order."""
    monkeypatch.chdir(repo_root)
    trained, served = add_adapters(_policy(0), LoraConfig(rank=4, alpha=8.0), seed=0), _policy(1)
    with torch.no_grad():
        for name, param in trained.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.3)
    names = weight_names(trained)
    assert names == weight_names(served)
    flat = flatten_weights(dict(full_parameters(trained, torch.device("cpu"))), names)
    params, offset = dict(served.named_parameters()), 0
    with torch.no_grad():
        for name in names:
            params[name].copy_(flat[offset : offset + params[name].numel()].view_as(params[name]))
            offset += params[name].numel()
    ids = torch.randint(3, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = (served(input_ids=ids).logits - trained(input_ids=ids).logits).abs().max()
        unmerged = (served(input_ids=ids).logits - _policy(0)(input_ids=ids).logits).abs().max()
    assert float(gap) < 1e-5 and float(unmerged) > 1e-2


def _part(rows: int, width: int, start: int) -> Experience:
    ids = torch.arange(start, start + rows * width).reshape(rows, width)
    return Experience(
        input_ids=ids,
        attention_mask=torch.ones(rows, width, dtype=torch.long),
        response_mask=torch.ones(rows, width),
        gen_logprobs=-torch.ones(rows, width),
        truncated=torch.tensor([start % 2 == 0] * rows),
    )


def test_rows_from_several_generation_ranks_are_padded_to_the_widest():
    merged = concat_rows([_part(2, 3, 0), _part(1, 5, 100)], pad_id=0)
    assert merged.input_ids.shape == (3, 5)
    assert merged.input_ids[:2, 3:].eq(0).all() and merged.input_ids[2].tolist() == [100, 101, 102, 103, 104]
    assert merged.attention_mask[:2, 3:].eq(0).all() and merged.response_mask[:2, 3:].eq(0).all()
    assert merged.gen_logprobs[:2, 3:].eq(0).all() and merged.truncated.tolist() == [True, True, True]
