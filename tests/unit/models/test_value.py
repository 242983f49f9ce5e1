import torch
from transformers import AutoModelForTokenClassification, Qwen2Config, Qwen2Model

from dtppo.models.value import ValueModel


def _backbone(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return Qwen2Model(cfg)


def test_value_at_t_does_not_see_tokens_from_t_on():
    model = ValueModel(_backbone(), seed=3).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, 40, (3, 12))
    attn = torch.ones_like(ids)
    base = model.values(ids, attn)
    for t in [1, 5, 11]:
        changed = ids.clone()
        changed[:, t:] = (changed[:, t:] + 7) % 40
        after = model.values(changed, attn)
        assert torch.allclose(after[:, : t + 1], base[:, : t + 1], atol=1e-6), t
        assert not torch.allclose(after[:, t + 1 :], base[:, t + 1 :]) if t < 11 else True
    assert torch.all(base[:, 0] == 0)


def test_unshifted_head_sees_the_action():
    # the experiment-only flag really changes alignment: V at t now depends on token t
    model = ValueModel(_backbone(), seed=3, shift=False).eval()
    ids = torch.randint(0, 40, (2, 6))
    changed = ids.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 40
    attn = torch.ones_like(ids)
    assert not torch.allclose(model.values(ids, attn)[:, 4], model.values(changed, attn)[:, 4])


def test_head_init_depends_only_on_seed():
    a = ValueModel(_backbone(), seed=5)
    torch.manual_seed(1234)
    torch.randn(1000)  # consume global RNG differently
    b = ValueModel(_backbone(), seed=5)
    c = ValueModel(_backbone(), seed=6)
    assert torch.equal(a.score.weight, b.score.weight)
    assert not torch.equal(a.score.weight, c.score.weight)
    assert a.score.weight.abs().sum() > 0


def test_save_pretrained_round_trip_and_transformers_loads_it(tmp_path):
    model = ValueModel(_backbone(), seed=2).eval()
    with torch.no_grad():
        model.score.bias.fill_(0.25)
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 40, (2, 9))
    attn = torch.ones_like(ids)
    loaded = ValueModel.from_pretrained(tmp_path).eval()
    assert torch.allclose(loaded.values(ids, attn), model.values(ids, attn), atol=1e-6)
    hf = AutoModelForTokenClassification.from_pretrained(tmp_path).eval()
    head = hf(input_ids=ids, attention_mask=attn).logits.squeeze(-1)
    assert torch.allclose(head[:, :-1], model.values(ids, attn)[:, 1:], atol=1e-6)
