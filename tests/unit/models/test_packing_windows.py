"""Packed rows on models whose layers attend differently (sliding windows per layer type): packed = padded, and the
check at start that refuses packing where a model's attention would not follow the packed sequences."""

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, Gemma3TextConfig, Qwen2Config

from dtppo.errors import InputError
from dtppo.models.logprobs import sequence_logprobs
from dtppo.models.packing import check_packing, packing_tolerance, probe_rows, probe_width
from dtppo.models.value import ValueModel

WINDOW = 5
VOCAB = 50


def _qwen2_windowed() -> Qwen2Config:
    # Layers 0-1 attend fully, layers 2-3 within a 5-token window (Qwen2's use_sliding_window + max_window_layers).
    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=2,
    )


def _gemma3() -> Gemma3TextConfig:
    return Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        max_position_embeddings=64,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )


def _qwen2_full() -> Qwen2Config:
    cfg = _qwen2_windowed()
    cfg.use_sliding_window, cfg.sliding_window = False, None
    cfg.layer_types = ["full_attention"] * 4
    return cfg


CONFIGS = {"qwen2-windowed": _qwen2_windowed, "gemma3": _gemma3}


def _build(auto, config):
    torch.manual_seed(0)
    config._attn_implementation = "sdpa"
    return auto.from_config(config).eval()


def _batch():
    """Rows of 16, 9, 7, 4 and 12 tokens: longer than the window, and short enough to share packed rows."""
    lengths = torch.tensor([16, 9, 7, 4, 12])
    mask = (torch.arange(16)[None] < lengths[:, None]).long()
    ids = torch.randint(0, VOCAB, mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    return ids, mask


def todays_mask(forward):
    """The mask packed rows carried before: one block-causal [R, 1, L, L] bool mask, applied to every layer as given
    (read from the restarting position_ids). The negative control: it drops the sliding layers' windows."""

    def with_block_mask(*args, attention_mask=None, position_ids=None, **kwargs):
        if attention_mask is None and position_ids is not None:
            segment = (position_ids == 0).cumsum(-1)
            causal = torch.ones(segment.shape[1], segment.shape[1], dtype=torch.bool).tril()
            attention_mask = ((segment[:, :, None] == segment[:, None, :]) & causal).unsqueeze(1)
        return forward(*args, attention_mask=attention_mask, position_ids=position_ids, **kwargs)

    return with_block_mask


@pytest.mark.parametrize("family", CONFIGS)
def test_packed_values_equal_padded_on_sliding_window_layers(family):
    critic = ValueModel(_build(AutoModel, CONFIGS[family]()), seed=2)
    ids, mask = _batch()
    with torch.no_grad():
        padded, packed = critic.values(ids, mask, packing=False), critic.values(ids, mask, packing=True)
    assert torch.allclose(packed * mask, padded * mask, atol=1e-5, rtol=0)
    # The window matters at this length: the same rows through full attention give other values.
    critic.backbone.config.layer_types = ["full_attention"] * 4
    with torch.no_grad():
        unwindowed = critic.values(ids, mask, packing=False)
    assert ((unwindowed - padded) * mask).abs().max() > 1e-3


@pytest.mark.parametrize("family", CONFIGS)
def test_packed_logprobs_equal_padded_on_sliding_window_layers(family):
    model = _build(AutoModelForCausalLM, CONFIGS[family]())
    ids, mask = _batch()
    with torch.no_grad():
        padded, packed = (sequence_logprobs(model, ids, mask, mask.bool(), 1.0, 8, p) for p in (False, True))
    assert torch.allclose(packed, padded, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", CONFIGS)
def test_the_check_refuses_todays_block_mask_on_sliding_window_layers(family):
    config = CONFIGS[family]()
    critic = ValueModel(_build(AutoModel, config), seed=2)
    critic.backbone.forward = todays_mask(critic.backbone.forward)
    ids, mask = probe_rows(VOCAB, probe_width(config, longest=64))
    with torch.no_grad():
        padded, packed = critic.values(ids, mask, packing=False), critic.values(ids, mask, packing=True)
    with pytest.raises(InputError, match=rf"value.sequence_packing: the {config.model_type} model .* set value"):
        check_packing("value.sequence_packing", config, "values", padded, packed, mask.bool(), 1e-3)


def test_the_check_passes_todays_block_mask_where_every_layer_attends_fully():
    config = _qwen2_full()
    critic = ValueModel(_build(AutoModel, config), seed=2)
    critic.backbone.forward = todays_mask(critic.backbone.forward)
    ids, mask = probe_rows(VOCAB, probe_width(config, longest=64))
    with torch.no_grad():
        padded, packed = critic.values(ids, mask, packing=False), critic.values(ids, mask, packing=True)
    assert check_packing("value.sequence_packing", config, "values", padded, packed, mask.bool(), 1e-3) < 1e-5


def test_probe_rows_cross_the_narrowest_window_within_the_runs_longest_sequence():
    assert probe_width(_gemma3(), longest=512) == WINDOW + 8
    assert probe_width(_gemma3(), longest=9) == 9  # a window the run never outgrows cannot matter to it
    assert probe_width(_qwen2_full(), longest=512) == 32
    ids, mask = probe_rows(VOCAB, 13)
    assert mask.sum(-1).tolist() == [13, 7, 6] and torch.all(ids[mask == 0] == 0)
    assert torch.equal(ids, probe_rows(VOCAB, 13)[0])  # the same probe on every rank


def test_the_tolerance_follows_the_compute_dtype():
    assert packing_tolerance(torch.float32) == 1e-3
    assert packing_tolerance(torch.bfloat16) == 0.0625
    differ = torch.tensor([[0.0, 0.5]])
    with pytest.raises(InputError, match="largest difference 0.5"):
        check_packing("policy.sequence_packing", _gemma3(), "log-probs", differ * 0, differ, torch.ones(1, 2), 1e-3)
    nan = torch.tensor([[0.0, float("nan")]])
    with pytest.raises(InputError):
        check_packing("policy.sequence_packing", _gemma3(), "log-probs", differ * 0, nan, torch.ones(1, 2), 1e-3)
