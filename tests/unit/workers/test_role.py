"""The policy and the critic as roles (``dtppo.workers.role``) in one process, over workers that record their calls:
a call runs on the worker where it lives and its result reaches every rank; a rank without the worker gets None from
the local calls; the lifecycle phases wrap a block; validation samples this rank's share of the problems with the
problems' own sample ids. Separate pools of ranks: tests/distributed/test_validation_split.py."""

from dtppo.config import from_dict
from dtppo.data.problem import Problem
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import Segment, build_episode_rows
from dtppo.workers.role import PolicyRole, Role, ValueRole

TOK = build_char_tokenizer()


class Recorder:
    """A worker that records each call and answers with something recognisable."""

    def __init__(self):
        self.calls = []
        self.skipped_steps = 2
        self.cfg, self.tokenizer, self.generator = from_dict({}), TOK, self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, *args))
            return f"{name} done"

        return call

    def sample(self, request):  # the generator validation samples with
        self.calls.append(("sample", request.sample_ids.tolist()))
        answers = [TOK(str(i), add_special_tokens=False)["input_ids"] for i in request.sample_ids.tolist()]
        episodes = [[Segment(a, 1, [0.0] * len(a))] for a in answers]
        return build_episode_rows(request.prompts, episodes, [0] * len(request), 0)


def test_calls_run_on_the_worker_and_their_results_reach_every_rank():
    worker = Recorder()
    role = PolicyRole(worker, range(1), colocated=True)
    assert role.train("batch") == "train done" and role.get_logprobs("rows") == "get_logprobs done"
    assert role.skipped_steps() == 2 and role.replicated_state() == "replicated_state done"
    role.refit(3)
    assert role.share({"loss": 1.0}) == {"loss": 1.0}
    assert ValueRole(worker, range(1), colocated=False).get_values("rows") == "get_values done"  # broadcast: itself
    assert worker.calls == [
        ("train", "batch"),
        ("get_logprobs", "rows"),
        ("replicated_state",),
        ("refit", 3),
        ("get_values", "rows"),
    ]


def test_a_rank_without_the_worker_gets_none_from_local_calls():
    role = Role(None, range(1, 2), colocated=False)
    assert role.train("batch") is None and role.checkpoint_state() is None
    role.load_checkpoint(None, {})  # nothing to restore here


def test_the_phases_wrap_the_block():
    worker = Recorder()
    role = PolicyRole(worker, range(1), colocated=True)
    with role.training():
        worker.calls.append(("inside",))
    with role.generation():
        pass
    assert [c[0] for c in worker.calls] == [
        "prepare_for_training",
        "inside",
        "finish_training",
        "prepare_for_generation",
        "finish_generation",
    ]


def test_validation_samples_the_share_of_this_rank_with_each_problems_id():
    worker = Recorder()
    problems = [Problem(f"Q{i}", "", str(i)) for i in range(5)]
    responses = PolicyRole(worker, range(1), colocated=True).sample_validation(problems, step=4)
    assert responses.texts == ["0", "1", "2", "3", "4"] and responses.lengths == [1.0] * 5
    sampled = [ids for name, ids in worker.calls if name == "sample"]
    assert [i for ids in sampled for i in ids] == list(range(5))
