"""Peer rows to tensors: group advantages, padding sides, merging."""

import pytest
import torch

from trl_ftis.peer_rows import PeerRow, assign_group_statistics, build_peer_batch, concat_rows, group_advantages


def test_group_advantages_are_normalised_within_each_group_only():
    rewards = torch.tensor([1.0, 0.0, 10.0, 20.0, 30.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 2])
    adv = group_advantages(rewards, groups, "group")
    # Group 0: mean 0.5, unbiased std sqrt(0.5); group 1: mean 20, std 10; group 2 alone: 0.
    s0 = 0.5**0.5
    expected = [0.5 / (s0 + 1e-4), -0.5 / (s0 + 1e-4), -10 / (10 + 1e-4), 0.0, 10 / (10 + 1e-4), 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected))
    torch.testing.assert_close(group_advantages(rewards, groups, "none"), torch.tensor([0.5, -0.5, -10, 0, 10, 0.0]))


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
        addition_problems(1, seed=0, split="dev")
