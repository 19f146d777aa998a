"""Every regular has its own share of a round's rows: whether an honest regular's message is taken never depends on
the order in which a collect reads senders or on how much another sender (a member with its own key) sends."""

import uuid

import pytest
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path

from trl_ftis.swarm.exchange_modes.free_window import FreeWindow
from trl_ftis.swarm.exchange_modes.sync_window import SyncWindow
from trl_ftis.swarm.round_budget import RoundBudget, RoundSpending

ROUNDS = 24


def big_rows(sender, round, groups=32, size=4):
    """`groups` groups of `size` rows each: 128 rows a round by default."""
    return [row for g in range(groups) for row in rows(sender, count=size, group=f"{sender}-{round}-{g}", round=round)]


@pytest.mark.parametrize("window", [SyncWindow, FreeWindow], ids=["sync", "free"])
def test_a_members_volume_never_costs_an_honest_regular_its_rows(tokenizer, window):
    url = f"memory://shares-{uuid.uuid4().hex}"
    member = make_swarm(url, "member", tokenizer)
    honest = make_swarm(url, "honest", tokenizer)
    receiver = make_swarm(url, "me", tokenizer, expected_peers=["member", "honest"], window=window)
    accepted = {"member": 0, "honest": 0}
    cut = 0
    for round in range(ROUNDS):
        member.publish(big_rows("member", round), round)
        honest.publish(rows("honest", count=8, group=f"h{round}", round=round), round)
        result = receiver.collect(round, max_rows=128)  # what a trainer with a cap of 32 rows passes
        for row in result.rows:
            accepted[row.sender] += 1
        cut += result.peers["member"].rows_cut
        # Every round, whichever sender is read first: the member's share is 128 // 3 = 42 rows, plus the 2 rows no
        # share reserves: cut to 11 whole groups of 4.
        assert sum(row.sender == "honest" for row in result.rows) == 8, round
        assert sum(row.sender == "member" for row in result.rows) == 44, round
        assert result.peers["honest"].rows_cut == 0
    assert accepted == {"honest": 8 * ROUNDS, "member": 44 * ROUNDS}
    assert cut == 84 * ROUNDS


def test_a_message_beyond_its_senders_share_is_cut_to_whole_groups_or_refused_when_none_fits(tokenizer):
    url = f"memory://shares-{uuid.uuid4().hex}"
    member = make_swarm(url, "member", tokenizer)
    receiver = make_swarm(url, "me", tokenizer, expected_peers=["member", "other"], peer_timeout=0.1)
    member.publish(big_rows("member", 0, groups=3, size=20), 0)  # three groups of 20: two fit in 42 + 2 unreserved
    result = receiver.collect(0, max_rows=128)
    groups = {row.group for row in result.rows}
    assert len(result.rows) == 40 and len(groups) == 2 and result.peers["member"].rows_cut == 20
    member.publish(big_rows("member", 1, groups=1, size=50), 1)  # one group larger than 44: none fits
    result = receiver.collect(1, max_rows=128)
    assert result.rows == [] and result.refused["round_budget"] == 1


def test_spending_gives_each_regular_and_the_newcomers_one_share():
    spending = RoundSpending(RoundBudget(), frozenset({"a", "b"}), per_sender=4, max_rows=90, until=float("inf"))
    assert spending.room("a") == (None, 30) and spending.room("stranger") == (None, 30)
    assert spending.take("a", 30, cut=False) is None
    assert spending.room("a") == (None, 0) and spending.room("b") == (None, 30)  # b's share is its own
    assert spending.examine("a", 100) == "share"  # a's further envelopes are not even read
    assert spending.examine("b", 100) is None
    assert spending.take("stranger", 0, cut=True) == "newcomers" and spending.take("b", 0, cut=True) == "share"
