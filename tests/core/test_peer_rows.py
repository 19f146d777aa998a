"""Peer rows to tensors: group advantages, padding sides, merging."""

import math

import pytest
import torch

from trl_ftis.peer_rows import (
    LOGP_FLOOR,
    PeerRow,
    assign_group_statistics,
    build_peer_batch,
    check_rows,
    concat_rows,
    group_advantages,
    row_problems,
)
from trl_ftis.sampling_bounds import MAX_LOGP


def test_group_advantages_are_normalised_within_each_group_only():
    rewards = torch.tensor([1.0, 0.0, 10.0, 20.0, 30.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 2])
    adv = group_advantages(rewards, groups, "group")
    # Group 0: mean 0.5, unbiased std sqrt(0.5); group 1: mean 20, std 10; group 2 alone: 0.
    s0 = 0.5**0.5
    expected = [0.5 / (s0 + 1e-4), -0.5 / (s0 + 1e-4), -10 / (10 + 1e-4), 0.0, 10 / (10 + 1e-4), 0.0]
    assert adv.dtype == torch.float64  # computed and returned in float64
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        group_advantages(rewards, groups, "none"), torch.tensor([0.5, -0.5, -10, 0, 10, 0.0], dtype=torch.float64)
    )


F32_MAX = float(torch.finfo(torch.float32).max)


@pytest.mark.parametrize("scale", [1.0, 1e-30, 5e-324, 1e30, F32_MAX / 3, 1e300])
def test_group_advantages_do_not_depend_on_the_scale_of_rewards(scale):
    """Rewards near the float32 maximum (or 1e300) used to overflow the group mean and std to inf, and every
    advantage, then every parameter, became NaN. In float64 with each group divided by its largest reward first,
    the advantages of `scale * r` are those of `r` (`1e-4` aside, which only matters for tiny rewards)."""
    base = torch.tensor([3.0, -1.0, 2.0, 3.0, -3.0, 1.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = group_advantages(base * scale, groups)
    assert torch.isfinite(adv).all()
    if scale >= 1.0:
        reference = base - base.view(2, 3).mean(1).repeat_interleave(3)
        reference = reference / base.view(2, 3).std(1).repeat_interleave(3)
        torch.testing.assert_close(adv, reference, rtol=1e-4, atol=0.0)
    if scale == 5e-324:  # 3 * 5e-324 and -5e-324: differences far below the 1e-4 in the denominator
        assert adv.abs().max() < 1e-300
    none = group_advantages(base * scale, groups, "none")
    assert torch.isfinite(none).all()
    if scale > 1e-300:  # subnormal rewards are not exact multiples of `base`
        centred = base - base.view(2, 3).mean(1).repeat_interleave(3)
        torch.testing.assert_close(none / scale, centred, rtol=1e-12, atol=1e-15)


def test_group_advantages_edge_groups():
    # Identical rewards, a group of one, all zeros, ±float32 max, a lone huge reward: finite, and 0 where no spread.
    rewards = torch.tensor([F32_MAX, F32_MAX, 7.0, 0.0, 0.0, F32_MAX, -F32_MAX, 1e300], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 2, 2, 3, 3, 4])
    adv = group_advantages(rewards, groups)
    assert adv[:5].tolist() == [0.0] * 5 and adv[7] == 0.0
    assert adv[5].item() == pytest.approx(2**-0.5, rel=1e-6) and adv[6].item() == pytest.approx(-(2**-0.5), rel=1e-6)
    none = group_advantages(rewards, groups, "none")
    assert none[5].item() == F32_MAX and none[6].item() == -F32_MAX  # finite in float64 (not in float32: dropped)
    nan = group_advantages(torch.tensor([1.0, float("nan"), 2.0, float("inf")]), torch.tensor([0, 0, 1, 1]))
    assert torch.isnan(nan).all()  # a non-finite reward poisons its own group only, and visibly
    assert group_advantages(torch.tensor([]), torch.tensor([], dtype=torch.long)).numel() == 0


def test_assign_group_statistics_in_float64_for_python_float_rewards():
    def row(reward, group):
        return PeerRow(prompt="p", completion_ids=[5], generator_logps=[-1.0], reward=reward, group=group)

    rows = [row(1e300, 0), row(-1e300, 0), row(5e-324, 1), row(0.0, 1), row(1e308, 2), row(1e308, 2)]
    assign_group_statistics(rows)
    advantages = [r.advantage for r in rows]
    assert all(math.isfinite(a) for a in advantages)
    assert advantages[0] == pytest.approx(2**-0.5, rel=1e-6) and advantages[1] == pytest.approx(-(2**-0.5), rel=1e-6)
    assert advantages[2:] == [0.0] * 4


def test_build_peer_batch_never_holds_an_infinite_log_prob():
    rows = [
        PeerRow(prompt="a", completion_ids=[5, 6], generator_logps=[-1e300, -0.0], reward=1, group=0),
        PeerRow(prompt="a", completion_ids=[7], generator_logps=[-3.4e38], reward=0, group=0),
    ]
    batch = build_peer_batch(rows, [[1], [1]], pad_token_id=0)
    assert torch.isfinite(batch.generator_logps).all() and batch.generator_logps.dtype == torch.float32
    assert batch.generator_logps[0, 0].item() == pytest.approx(LOGP_FLOOR) and batch.generator_logps[0, 1] == 0.0
    assert batch.advantages.dtype == torch.float32 and torch.isfinite(batch.advantages).all()


def test_row_problems_names_bad_ids_and_log_probs_without_raising():
    def row(ids, logps):
        return PeerRow(prompt="p", completion_ids=ids, generator_logps=logps, reward=0.0, group=0, sender="s")

    rows = [
        row([1, 2], [-1.0, -2.0]),
        row([1, 99], [-1.0, -2.0]),
        row([1.5, 2], [-1.0, -2.0]),
        row([1, 2], [-1.0, float("nan")]),
        row([1, 2], [-1.0, 0.5]),
        row([1, 2], [-1e300, MAX_LOGP]),
    ]
    assert row_problems(rows, 10) == [None, "bad_ids", "bad_ids", "bad_logps", "bad_logps", None]
    assert row_problems(rows[:1], 10) == [None] and row_problems([], 10) == []
    with pytest.raises(ValueError, match="vocabulary"):
        check_rows(rows[:2], 10)


def test_assign_group_statistics_groups_by_sender_and_group_in_any_order():
    def row(sender, group, length, reward):
        return PeerRow(
            prompt="p",
            completion_ids=[5] * length,
            generator_logps=[-1.0] * length,
            reward=reward,
            group=group,
            sender=sender,
        )

    rows = [row("x", 1, 3, 1.0), row("x", 0, 7, 0.0), row("x", 1, 2, 0.0), row("x", 0, 5, 1.0), row("y", 1, 6, 1.0)]
    assign_group_statistics(rows)
    assert [r.group_max_length for r in rows] == [3, 7, 3, 7, 6]  # ("y", 1) is not ("x", 1)
    assert rows[0].advantage > 0 > rows[2].advantage and rows[4].advantage == 0.0


def test_build_peer_batch_pads_prompts_left_and_completions_right():
    rows = [
        PeerRow(prompt="a", completion_ids=[5, 6, 7], generator_logps=[-1, -2, -3], reward=1, group=0, sender="x"),
        PeerRow(prompt="b", completion_ids=[8], generator_logps=[-4], reward=0, group=0, sender="x"),
        PeerRow(prompt="c", completion_ids=[9, 9], generator_logps=[-5, -6], reward=3, group=0, sender="y"),
    ]
    batch = build_peer_batch(rows, [[1, 2], [3], [4, 4, 4]], pad_token_id=0)
    assert batch.prompt_ids.tolist() == [[0, 1, 2], [0, 0, 3], [4, 4, 4]]
    assert batch.prompt_mask.tolist() == [[0, 1, 1], [0, 0, 1], [1, 1, 1]]
    assert batch.completion_ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 9, 0]]
    assert batch.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert batch.generator_logps.tolist() == [[-1, -2, -3], [-4, 0, 0], [-5, -6, 0]]
    # Same group name, different senders: two groups. Sender y's group has one row.
    assert batch.group_max_lengths.tolist() == [3, 3, 2]
    assert batch.advantages[2] == 0 and batch.advantages[0] > 0 > batch.advantages[1]
    assert batch.senders == ["x", "x", "y"]


def test_build_peer_batch_checks_the_prompt_count():
    row = PeerRow(prompt="a", completion_ids=[5], generator_logps=[-1], reward=1, group=0)
    with pytest.raises(ValueError, match="1 peer rows but 2"):
        build_peer_batch([row], [[1], [2]], pad_token_id=0)


def test_concat_rows_widens_prompts_on_the_left_and_the_rest_on_the_right():
    local = {
        "prompt_ids": torch.tensor([[7, 8]]),
        "prompt_mask": torch.tensor([[1, 1]]),
        "completion_ids": torch.tensor([[5, 6, 2]]),
        "advantages": torch.tensor([0.5]),
        "num_items_in_batch": torch.tensor(3),
        "old_per_token_logps": torch.tensor([[-1.0, -1.0, -1.0]]),
    }
    extra = {
        "prompt_ids": torch.tensor([[1, 2, 3]]),
        "prompt_mask": torch.tensor([[1, 1, 1]]),
        "completion_ids": torch.tensor([[4]]),
        "advantages": torch.tensor([-1.0]),
        "old_per_token_logps": torch.tensor([[-2.0]]),
    }
    merged = concat_rows(local, extra, pad_token_id=0)
    assert merged["prompt_ids"].tolist() == [[0, 7, 8], [1, 2, 3]]
    assert merged["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert merged["completion_ids"].tolist() == [[5, 6, 2], [4, 0, 0]]
    assert merged["old_per_token_logps"].tolist() == [[-1, -1, -1], [-2, 0, 0]]
    assert merged["advantages"].tolist() == [0.5, -1.0]
    assert merged["num_items_in_batch"] is local["num_items_in_batch"]
    with pytest.raises(KeyError, match="old_per_token_logps"):
        concat_rows(local, {k: v for k, v in extra.items() if k != "old_per_token_logps"}, pad_token_id=0)


def test_addition_splits_are_disjoint_and_seed_independent():
    from trl_ftis.tasks.addition import addition_problems, in_test_split

    train = addition_problems(3000, seed=1, split="train")
    test_a = addition_problems(300, seed=2, split="test")
    test_b = addition_problems(300, seed=3, split="test")
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in test_a + test_b}
    assert all(in_test_split(p["prompt"]) for p in test_a) and not any(in_test_split(p["prompt"]) for p in train)
    assert all(int(p["answer"]) == sum(map(int, p["prompt"][:-1].split("+"))) for p in train[:50])
    with pytest.raises(ValueError, match="split"):
        addition_problems(1, seed=0, split="validation")
