"""The training forwards' attention (``models.attention``): equal to transformers' SDPA under its dense masks (fp32,
forward and gradients) on padded and packed rows, windows and grouped-query heads included, and never a tensor as
large as ``L × L``; the negative controls show the checks can fail."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModel, Gemma2Config, Gemma3TextConfig, MistralConfig, Qwen2Config

from dtppo.distributed.context import ContextShards
from dtppo.models.attention import KERNEL, Segments, attention_implementation, context_parallel_refusal
from dtppo.models.packing import pack_rows
from dtppo.models.value import ValueModel

VOCAB = 64


def _qwen2():
    return Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64,
    )  # fmt: skip


def _mistral_window():
    return MistralConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=64, sliding_window=5,
    )  # fmt: skip


def _gemma3():
    return Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )  # fmt: skip


FAMILIES = {"qwen2": _qwen2, "mistral-window": _mistral_window, "gemma3": _gemma3}


def _pair(config):
    """(transformers' SDPA model, the same weights with dtppo's kernel)."""
    torch.manual_seed(0)
    config._attn_implementation = "sdpa"
    reference = AutoModel.from_config(config).eval()
    ours = copy.deepcopy(reference)
    ours.set_attn_implementation(KERNEL)
    return reference, ours


def _batch(width=19):
    """Right-padded rows of 19, 11, 3, 7 and 1 tokens: longer and shorter than the windows; packed, a document
    boundary falls inside a row."""
    lengths = torch.tensor([width, 11, 3, 7, 1])
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, mask.shape, generator=torch.Generator().manual_seed(3)) * mask
    return ids, mask


def _run(model, ids, mask, layout):
    """Hidden states [B, T, H] of the rows, through ``layout``: the dense padding mask (transformers' path before),
    no mask on the right-padded rows, or packed rows with their segments."""
    if layout == "masked":
        return model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    if layout == "padded":
        return model(input_ids=ids, use_cache=False).last_hidden_state
    packed = pack_rows(ids, mask)
    out = model(
        input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False, dtppo_segments=packed.segments
    ).last_hidden_state
    return packed.unpack(out)


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_kernel_equals_sdpa_under_the_dense_mask_forward_and_gradients(family, layout):
    reference, ours = _pair(FAMILIES[family]())
    ids, mask = _batch()
    assert pack_rows(ids, mask).num_rows < ids.shape[0]  # packing put two sequences in one row
    weights = torch.randn(ids.shape + (32,), generator=torch.Generator().manual_seed(4)).double()
    grads = []
    for model, how in ((reference, "masked"), (ours, layout)):
        hidden = _run(model, ids, mask, how)
        # Poison: whatever a pad position holds must not reach a real token's loss.
        loss = (hidden.double() * weights * mask[..., None]).sum()
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        if how == "masked":
            expected = hidden.detach()
        else:
            got = hidden.detach()
    real = mask.bool()
    assert (got - expected)[real].abs().max() <= 1e-5
    assert (grads[1] - grads[0]).abs().max() <= 1e-5 * max(1.0, grads[0].abs().max().item())


def test_without_segments_packed_rows_attend_across_documents():
    # The negative control: packed rows through the kernel without their boundaries are one sequence per row.
    reference, ours = _pair(_qwen2())
    ids, mask = _batch()
    packed = pack_rows(ids, mask)
    with torch.no_grad():
        expected = _run(reference, ids, mask, "masked")
        leaked = packed.unpack(ours(input_ids=packed.input_ids, position_ids=packed.position_ids).last_hidden_state)
    assert (leaked - expected)[mask.bool()].abs().max() > 1e-2


def test_a_window_that_is_ignored_is_caught():
    # The negative control for windows: full attention on Mistral's windowed rows differs from the reference.
    reference, ours = _pair(_mistral_window())
    ours.config.sliding_window = None  # Mistral's attention reads its window from the config
    ids, mask = _batch()
    with torch.no_grad():
        differ = (_run(ours, ids, mask, "padded") - _run(reference, ids, mask, "masked"))[mask.bool()]
    assert differ.abs().max() > 1e-2


class _LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.most = max(self.most, x.numel())
        return out


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_no_op_makes_a_tensor_as_large_as_length_squared(family, layout):
    width = 384  # L² = 147,456, above any [rows, L, hidden] or [rows, L, vocab] here (5·384·64 = 122,880)
    _, ours = _pair(FAMILIES[family]())
    ids, mask = _batch(width)
    with _LargestTensor() as seen:
        _run(ours, ids, mask, layout).sum().backward()
    assert seen.most < width * width
    with _LargestTensor() as dense:  # the control: the masked path builds [B, 1, L, L]
        _run(ours, ids, mask, "masked")
    assert dense.most >= width * width


def test_segments_group_sequences_of_similar_length():
    # Spans of 8, 2, 5 and 3 tokens among 18: [8, 5] pad to 8, [3, 2] to 3; every token appears once.
    segments = Segments.of_spans([(0, 8), (8, 10), (10, 15), (15, 18)], 18)
    assert [g.shape for g in segments.groups] == [(2, 8), (2, 3)]
    flat = torch.cat([g.flatten() for g in segments.groups])
    assert sorted(flat[flat < 18].tolist()) == list(range(18))
    by_positions = Segments.of_positions(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]))
    spans = sorted(tuple(row[row < 10].tolist()) for g in by_positions.groups for row in g)
    assert spans == [(0, 1, 2), (3, 4), (5, 6), (7, 8, 9)]


def test_models_with_what_the_kernel_does_not_compute_keep_sdpa():
    assert attention_implementation(_qwen2()) == KERNEL
    assert attention_implementation(_gemma3()) == KERNEL
    assert attention_implementation(Gemma2Config(attn_logit_softcapping=50.0)) == "sdpa"


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("packing", [False, True])
def test_the_context_parallel_kernel_equals_sdpa_forward_and_gradients(layout, packing):
    """One rank of a context-parallel group (its gathers are the identity): zigzag splits each row in two chunks,
    the second attending to the first's keys through the log-sum-exp merge; packed rows put a sequence boundary
    inside a chunk."""
    config = _qwen2()
    config._attn_implementation = KERNEL
    torch.manual_seed(0)
    critic = ValueModel(AutoModel.from_config(config), sequence_packing=packing)
    sharded = copy.deepcopy(critic)
    sharded.shards = ContextShards(0, 1, layout=layout)
    ids, mask = _batch()
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(4)).double()
    results = []
    for model in (critic, sharded):
        values = model.values(ids, mask)
        (values.double() * weights * mask).sum().backward()
        results.append((values.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (expected, expected_grad), (got, got_grad) = results
    assert ((got - expected) * mask).abs().max() <= 1e-5
    assert (got_grad - expected_grad).abs().max() <= 1e-5 * expected_grad.abs().max()


def test_context_parallelism_refuses_what_its_kernel_does_not_compute():
    assert context_parallel_refusal(_qwen2()) is None
    assert "sliding-window" in context_parallel_refusal(_gemma3())
    assert "sliding-window" in context_parallel_refusal(_mistral_window())
    assert "sdpa" in context_parallel_refusal(Gemma2Config(attn_logit_softcapping=50.0))
