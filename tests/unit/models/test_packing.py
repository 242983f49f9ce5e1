"""Sequence packing: layout, the per-sequence shift, and parity with the padded path (fp32, 1e-5)."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2Model

from dtppo.models.packing import first_fit_decreasing, pack_rows
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.value import ValueModel
from dtppo.observability.metrics import normalise
from dtppo.ops import shift_right
from dtppo.types import Experience
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.value import ValueWorker
from tests.support.batches import spy_on_packing, synthetic_experience
from tests.support.parity import FORWARD_TOL, GRAD_RTOL, relative_gradient_diff
from tests.support.recipes import tiny_config

TOL = FORWARD_TOL  # packing reorders float32 sums, as a layout does (tests/support/parity.py); gradients: GRAD_RTOL
SMALL = [
    f"{w}.model.tiny.{k}={v}"
    for w in ("policy", "value")
    for k, v in [
        ("hidden_size", 32),
        ("num_layers", 2),
        ("num_heads", 4),
        ("num_kv_heads", 2),
        ("intermediate_size", 64),
    ]
]


def _batch(vocab=40, lengths=(5, 12, 3, 9, 7, 1, 12, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    width = int(lengths.max())
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    return torch.randint(1, vocab, (len(lengths), width), generator=g) * mask, mask


def test_first_fit_decreasing_fills_rows_longest_first():
    # 12 fills a row; 9 opens one (room 3); 7 opens one (room 5), which 5 then fills; 3 fills the 9's row
    assert first_fit_decreasing([5, 12, 3, 9, 7, 1], 12) == [[1], [3, 2], [4, 0], [5]]


def test_pack_rows_layout_round_trips():
    ids, mask = _batch()
    packed = pack_rows(ids, mask)
    assert packed.num_rows < ids.shape[0] and packed.input_ids.shape[1] <= ids.shape[1]
    assert torch.equal(packed.unpack(packed.input_ids), ids * mask)
    assert int((packed.source >= 0).sum()) == int(mask.sum())
    assert int(packed.sequence_starts.sum()) == ids.shape[0]
    # positions restart at each sequence and match the padded positions of the token they came from
    t = packed.source.clamp(min=0) % ids.shape[1]
    assert torch.equal(torch.where(packed.source >= 0, packed.position_ids, t), t)


def test_pack_rows_rejects_left_padding():
    ids, mask = _batch()
    with pytest.raises(ValueError, match="right-padded"):
        pack_rows(ids, mask.flip(-1))


def test_shift_right_restarts_at_sequence_starts():
    x = torch.tensor([[1.0, 2, 3, 4, 5]])
    starts = torch.tensor([[True, False, False, True, False]])
    assert torch.equal(shift_right(x, starts), torch.tensor([[0.0, 1, 2, 0, 4]]))
    assert torch.equal(shift_right(x.unsqueeze(-1), starts), torch.tensor([[0.0, 1, 2, 0, 4]]).unsqueeze(-1))


def _value_models():
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "sdpa"
    padded = ValueModel(Qwen2Model(cfg), seed=3)
    packed = ValueModel(Qwen2Model(cfg), seed=3, sequence_packing=True)
    packed.load_state_dict(padded.state_dict())
    return padded, packed


def test_packed_values_and_gradients_match_padded():
    padded, packed = _value_models()
    ids, mask = _batch()
    target = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for model in (padded, packed):
        values = model.values(ids, mask) * mask
        ((values - target) ** 2 * mask).sum().backward()
        results.append((values.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert float((results[0][0] - results[1][0]).abs().max()) < TOL
    assert max(relative_gradient_diff(results[0][1], results[1][1]).values()) <= GRAD_RTOL


def test_packed_value_never_reads_across_a_sequence_boundary():
    _, model = _value_models()
    model.eval()
    ids, mask = _batch()
    with torch.no_grad():
        base = model.values(ids, mask)
    assert torch.all(base[:, 0] == 0)  # each sequence's first state has no earlier position to read from
    packed = pack_rows(ids, mask)
    for row in range(ids.shape[0]):
        # every other sequence changes completely; this one's values, packed next to them, must not
        others = torch.ones(ids.shape[0], dtype=torch.bool)
        others[row] = False
        changed = ids.clone()
        changed[others] = (changed[others] + 7) % 40 * mask[others]
        assert torch.equal(pack_rows(changed, mask).source, packed.source)  # same packing, new neighbours
        with torch.no_grad():
            after = model.values(changed, mask)
        assert float((after[row] - base[row]).abs().max()) < 1e-6, row


def _config(packing: bool):
    flags = [f"policy.sequence_packing={packing}", f"value.sequence_packing={packing}"]
    return tiny_config(
        *SMALL,
        *flags,
        "ppo.init_from_sft=false",
        "ppo.num_prompts_per_step=8",
        "policy.train_global_batch_size=8",
        "value.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "value.train_micro_batch_size=4",
    )


def _experience(vocab: int) -> Experience:
    return synthetic_experience(
        vocab,
        seed=2,
        prompt_lengths=range(3, 9),
        response_lengths=range(1, 15),
        short_first_half=None,
        rewards=False,
    )


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _round(packing: bool) -> dict:
    """Inference, one loss + backward on the whole batch, then one train() of each worker."""
    cfg, tok = _config(packing), build_char_tokenizer()
    policy, value = PolicyWorker(cfg, tok), ValueWorker(cfg, tok)
    exp = _experience(len(tok))
    values, logprobs = value.get_values(exp), policy.get_logprobs(exp)
    noise = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1)) * 0.1
    exp = exp.replace(old_values=values + 0.3 * noise, old_logprobs=logprobs + noise)
    out = {"values": values, "logprobs": logprobs}
    num_tokens = exp.response_mask.sum()
    for name, worker in (("policy", policy), ("value", value)):
        loss, stats = worker.loss(exp.slice(0, exp.batch_size))
        (loss / num_tokens).backward()  # the engine's normalisation: one global token-mean
        out[f"{name}_loss"], out[f"{name}_grads"] = loss.detach() / num_tokens, _grads(worker.model)
        out[f"{name}_stats"] = normalise(stats, num_tokens)
        worker.model.zero_grad(set_to_none=True)
        out[f"{name}_train"] = worker.train(exp)
    return out


def test_workers_packed_match_padded_logprobs_values_losses_gradients(monkeypatch):
    packings = spy_on_packing(monkeypatch)
    padded = _round(False)
    assert packings == []  # the padded path packs nothing
    packed = _round(True)
    # the packed path ran, and packed: fewer rows than it was given
    assert packings and sum(out for _, out in packings) < sum(rows for rows, _ in packings)
    for key, a in padded.items():
        if key.endswith("_grads"):
            assert max(relative_gradient_diff(a, packed[key]).values()) <= GRAD_RTOL, key
            continue
        b = packed[key]
        pairs = a.items() if isinstance(a, dict) else [(key, a)]
        for name, x in pairs:
            y = b[name] if isinstance(b, dict) else b
            assert float((x.float() - y.float()).abs().max()) < TOL, (key, name)
