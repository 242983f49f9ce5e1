import torch

from dtppo.ops import entropy_from_logits, logprobs_from_logits, masked_mean, masked_sum, masked_var, shift_right
from dtppo.types import build_response_mask


def test_masked_reductions_ignore_poison():
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), 5.0, 7.0]])
    m = torch.tensor([[1.0, 0, 1], [0, 1, 1]])
    assert masked_sum(x, m).item() == 16.0
    assert masked_mean(x, m).item() == 4.0
    assert abs(masked_var(x, m).item() - torch.tensor([1.0, 3, 5, 7]).var().item()) < 1e-6


def test_logprobs_from_logits_aligned_to_previous_position():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    ids = torch.randint(0, 11, (2, 5))
    lp = logprobs_from_logits(logits, ids)
    assert torch.all(lp[:, 0] == 0)
    for b in range(2):
        for t in range(1, 5):
            expected = torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]]
            assert abs(lp[b, t].item() - expected.item()) < 1e-6


def test_entropy_of_uniform():
    assert torch.allclose(entropy_from_logits(torch.zeros(1, 2, 8)), torch.full((1, 2), torch.log(torch.tensor(8.0))))


def test_shift_right_and_response_mask():
    assert torch.equal(shift_right(torch.tensor([[1, 2, 3]])), torch.tensor([[0, 1, 2]]))
    mask = build_response_mask(torch.tensor([2, 1]), torch.tensor([2, 3]), 5)
    assert torch.equal(mask, torch.tensor([[0.0, 0, 1, 1, 0], [0, 1, 1, 1, 0]]))
