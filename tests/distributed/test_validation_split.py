"""Validation is split across the policy's ranks: on 2 gloo ranks each generator samples half of the problems, and
the gathered answers are in the set's order and equal one rank's answers to the whole set (each answer's noise is
seeded by its problem's global index). A stand-in generator answers each row with its sample id, so the answers
show which index seeded them."""

import json
import tempfile
import types
from pathlib import Path

import torch

from dtppo.data.tiny_math import validation_set
from dtppo.distributed.comm import rank
from dtppo.distributed.ranks import run_ranks
from dtppo.generation.sampler import left_padded, right_padded
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import Experience, SampleRequest
from dtppo.workers.role import PolicyRole
from tests.support.recipes import tiny_config

PROBLEMS = 37  # not a multiple of the ranks, nor of the validation batch
OVERRIDES = ("ppo.validation.batch_size=8", "ppo.validation.greedy=false")


class IdAnswers:
    """A generator whose answer to each row is ``#### <sample id>``; it counts the rows it sampled."""

    def __init__(self, tokenizer):
        self.tokenizer, self.rows = tokenizer, 0

    def sample(self, request: SampleRequest) -> Experience:
        self.rows += len(request.prompts)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        answers = [
            self.tokenizer.encode(f"#### {int(i)}", add_special_tokens=False) + [eos] for i in request.sample_ids
        ]
        width = max(map(len, answers))
        tokens = torch.tensor([a + [pad] * (width - len(a)) for a in answers])
        ids, _, lengths = left_padded(request.prompts, pad, torch.device("cpu"))
        return right_padded(ids, lengths, tokens, torch.zeros(tokens.shape), (eos,), pad)


def _validate(out_dir: str, ranks: int) -> None:
    cfg = tiny_config(*OVERRIDES)
    tok = build_char_tokenizer()
    worker = types.SimpleNamespace(generator=IdAnswers(tok), tokenizer=tok, cfg=cfg)
    role = PolicyRole(worker, range(ranks), colocated=True)
    responses = role.sample_validation(validation_set(cfg.data.tiny_math, PROBLEMS), step=3)
    record = {"texts": responses.texts, "lengths": responses.lengths, "rows": worker.generator.rows}
    Path(out_dir, f"rank{rank()}.json").write_text(json.dumps(record))


def test_each_policy_rank_samples_its_share_and_every_rank_gets_the_whole_set_in_order():
    with tempfile.TemporaryDirectory() as out:
        run_ranks(_validate, 2, out, 2)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
        _validate(out, 1)  # one process: the whole set on one generator
        alone = json.loads(Path(out, "rank0.json").read_text())
    assert alone["rows"] == PROBLEMS and alone["texts"] == [f"#### {i}" for i in range(PROBLEMS)]
    assert [r["rows"] for r in ranks] == [18, 19]  # before: 37 on each rank, 36 of every 37 answers thrown away
    for r in ranks:
        assert r["texts"] == alone["texts"] and r["lengths"] == alone["lengths"]
