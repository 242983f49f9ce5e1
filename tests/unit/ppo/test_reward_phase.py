"""The reward phase's tensors (``ppo.reward_phase``): no step tensors when no sample has a step, a batch's steps
added to an episode's turn rewards, the failed samples out of training, the overlong penalties on the outcome; the
whole phase (``rewarded``) on rank 0 and on a rank without the scorer."""

import torch

from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.ppo.reward_phase import BatchRewards, rewarded, score_batch, shared, with_rewards
from dtppo.rewards.rewarder import RewardBreakdown
from dtppo.types import Experience

B, T = 3, 6


def _experience(**fields) -> Experience:
    ids = torch.full((B, T), 10)
    mask = torch.zeros(B, T)
    mask[:, 2:5] = 1.0
    plain = Experience(
        ids, torch.ones(B, T, dtype=torch.long), mask, torch.zeros(B, T), torch.zeros(B, dtype=torch.bool)
    )
    return plain.replace(**fields)


class Fixed:
    """A rewarder giving ``steps``; it runs the phase's ``while_scoring`` as the scoring pool does and records it."""

    def __init__(self, steps):
        self.steps, self.gave_steps, self.given = steps, False, []

    def score(self, problems, texts, while_scoring=None):
        self.given.append(while_scoring is not None)
        if while_scoring is not None:
            while_scoring()
        self.gave_steps = any(self.steps)
        return RewardBreakdown(torch.ones(B), self.steps, {}, torch.tensor([False, True, False]), {})


def test_no_step_in_the_batch_means_no_step_tensors():
    scored, rewards = score_batch(Fixed([(), (), ()]), build_char_tokenizer(), _experience(), [None] * B)
    assert rewards.steps is None and rewards.failed.tolist() == [0.0, 1.0, 0.0]
    assert shared(rewards, _experience()).steps is None  # one process: rank 0's own
    out = with_rewards(_experience(), rewards, torch.tensor([0.0, -0.5, 0.0]))
    assert out.step_rewards is None and out.rewards.tolist() == [1.0, 0.5, 1.0]
    assert out.sample_mask.tolist() == [1.0, 0.0, 1.0]


def test_a_batchs_steps_join_an_episodes_turn_rewards():
    turns, turn_mask = torch.zeros(B, T), torch.zeros(B, T)
    turns[0, 3], turn_mask[0, 3] = 2.0, 1.0
    steps = torch.zeros(2, B, T)
    steps[0, 0, 3], steps[1, 0, 3] = 0.5, 1.0
    steps[0, 2, 2], steps[1, 2, 2] = -1.0, 1.0
    rewards = BatchRewards(torch.zeros(B), torch.zeros(B), steps)
    out = with_rewards(_experience(step_rewards=turns, step_mask=turn_mask), rewards, torch.zeros(B))
    assert out.step_rewards[0, 3] == 2.5 and out.step_rewards[2, 2] == -1.0
    assert out.step_mask.sum() == 2 and out.sample_mask is None


def test_the_phase_scores_places_and_adds_the_rewards():
    tokenizer = build_char_tokenizer()
    ids = torch.tensor(tokenizer.encode("1+1=2", add_special_tokens=False))
    experience = _experience().replace(input_ids=torch.cat([torch.full((B, 2), 10), ids.expand(B, 5)], 1)[:, :T])
    # the response is tokens 2..4, "1+1": a step ending at character 2 sits on token 3, at character 3 on token 4
    steps = [((2, 0.25),), (), ((3, -1.0),)]
    out, scored = rewarded(Fixed(steps), tokenizer, experience, [None] * B, -torch.ones(B))
    assert scored.steps == steps and out.rewards.tolist() == [0.0, 0.0, 0.0]  # outcome 1 plus the penalty -1
    assert out.step_rewards[0].tolist() == [0.0, 0.0, 0.0, 0.25, 0.0, 0.0]
    assert out.step_rewards[2].tolist() == [0.0, 0.0, 0.0, 0.0, -1.0, 0.0] and out.step_mask.sum() == 2
    assert out.sample_mask.tolist() == [1.0, 0.0, 1.0]  # the failed sample leaves training
    # a rank without the scorer (one process here) gets no reward but its penalty, and nothing to log
    elsewhere, nothing = rewarded(None, tokenizer, experience, [None] * B, -torch.ones(B))
    assert nothing is None and elsewhere.rewards.tolist() == [-1.0] * B and elsewhere.step_rewards is None


def test_after_a_batch_with_steps_the_next_ones_tokens_are_measured_while_it_is_scored():
    tokenizer = build_char_tokenizer()
    ids = torch.tensor(tokenizer.encode("1+1=2", add_special_tokens=False))
    experience = _experience().replace(input_ids=torch.cat([torch.full((B, 2), 10), ids.expand(B, 5)], 1)[:, :T])
    stepped, plain = Fixed([((2, 0.25),), (), ((3, -1.0),)]), Fixed([(), (), ()])
    placed = [score_batch(stepped, tokenizer, experience, [None] * B)[1].steps for _ in range(3)]
    for _ in range(2):
        score_batch(plain, tokenizer, experience, [None] * B)
    assert stepped.given == [False, True, True] and plain.given == [False, False]
    assert all(torch.equal(p, placed[0]) for p in placed)  # measured before the scores came or after: the same
