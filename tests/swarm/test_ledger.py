"""`PeerRowLedger`: the counts about peer rows, their warnings and per-step metrics, without a trainer."""

import logging

import pytest
from swarm_helpers import rows  # tests/ is on sys.path

from trl_ftis.swarm.admission import DROP_REASONS
from trl_ftis.swarm.ledger import MAX_WARNED, PeerRowLedger


def test_drops_are_counted_and_warned_about_once_per_peer_and_reason(caplog):
    ledger = PeerRowLedger(DROP_REASONS)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.ledger"):
        for _ in range(3):
            ledger.count("a", "too_long", 2)
        ledger.count("b", "too_long")
        ledger.count("a", "reserved_column", 4, stripped=True)
    assert ledger.dropped == {"too_long": 7} and ledger.dropped_totals == {"too_long": 7}
    assert ledger.stripped == {"reserved_column": 4}  # changed and kept: not a drop
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 3 and all(record.name == "trl_ftis.swarm.ledger" for record in caplog.records)
    assert DROP_REASONS["too_long"] in messages[0] and "ftis/peer_rows_dropped/too_long" in messages[0]
    assert ledger.warned("a", "too_long") and not ledger.warned("a", "bad_ids")


def test_a_rare_special_token_drop_is_counted_without_a_console_warning(caplog):
    """A sampled model writes its padding or unknown token inside a completion now and then (every tiny swarm did:
    1 row in 64): each receiver drops such a row, and counts it, but a warning per peer would be noise in every swarm.
    Most of a sender's rows dropped for it (a mismatched end-of-sequence token, an injected marker) still warns."""
    ledger = PeerRowLedger(DROP_REASONS)
    pool = rows("small", 64)
    with caplog.at_level(logging.INFO, logger="trl_ftis.swarm.ledger"):
        kept = ledger.sift(pool, ["special_tokens"] + [None] * 63)
    assert len(kept) == 63 and ledger.dropped == {"special_tokens": 1}
    assert ledger.step_row_counts()["ftis/peer_rows_dropped/special_tokens"] == 1.0
    assert [record.levelno for record in caplog.records] == [logging.INFO]
    assert "ftis/peer_rows_dropped/special_tokens" in caplog.records[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trl_ftis.swarm.ledger"):
        ledger.sift(pool, ["special_tokens"] + [None] * 63)  # said once per peer and reason
        ledger.sift(pool[:16], ["special_tokens"] * 16)  # all of them: worth a warning
        ledger.sift(rows("big", 16), ["too_long"] + [None] * 15)  # any other reason warns as before
    assert [(record.levelno, record.getMessage().split(":")[0]) for record in caplog.records] == [
        (logging.WARNING, "Dropped 16 peer row(s) from 'small'"),
        (logging.WARNING, "Dropped 1 peer row(s) from 'big'"),
    ]
    assert ledger.dropped_totals == {"special_tokens": 18, "too_long": 1}


def test_warnings_are_bounded_for_a_flood_of_sender_names(caplog):
    ledger = PeerRowLedger()
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.ledger"):
        for sender in range(MAX_WARNED + 500):
            ledger.count(f"s{sender}", "too_long")
    assert ledger.num_warned == MAX_WARNED == len(caplog.records)
    assert ledger.dropped["too_long"] == MAX_WARNED + 500  # every row still counted


def test_sift_keeps_the_rows_without_a_problem_and_counts_the_others_by_sender():
    ledger = PeerRowLedger()
    pool = rows("a", 3) + rows("b", 2)
    kept = ledger.sift(pool, [None, "bad_ids", "bad_ids", None, "too_long"])
    assert kept == [pool[0], pool[3]]
    assert ledger.dropped == {"bad_ids": 2, "too_long": 1}
    ledger.count_trimmed(row.sender for row in pool[:2])
    assert ledger.dropped["batch_split"] == 2


def test_step_row_counts_reset_each_step_and_keep_every_reason_seen():
    ledger = PeerRowLedger()
    ledger.count("a", "too_long", 3)
    ledger.count("a", "reserved_column", 1, stripped=True)
    first = ledger.step_row_counts()
    assert first == {
        "ftis/peer_rows_dropped": 3.0,
        "ftis/peer_rows_dropped/too_long": 3.0,
        "ftis/peer_rows_stripped/reserved_column": 1.0,
    }
    ledger.count("b", "bad_ids")
    second = ledger.step_row_counts()
    assert second["ftis/peer_rows_dropped"] == 1.0 and second["ftis/peer_rows_dropped/bad_ids"] == 1.0
    assert second["ftis/peer_rows_dropped/too_long"] == 0.0 and second["ftis/peer_rows_stripped/reserved_column"] == 0
    assert ledger.dropped_totals == {"too_long": 3, "bad_ids": 1}  # the run's totals are not reset


def test_rounds_and_sources_are_recorded():
    ledger = PeerRowLedger()
    ledger.record_round(rows_sent=8, bytes_sent=100, rows_received=6, accepted=rows("a", 4), refused={"stale": 2})
    ledger.record_round(rows_sent=8, bytes_sent=50, rows_received=0, accepted=[], refused={})
    assert {k: ledger.totals[k] for k in ("rows_sent", "bytes_sent", "rows_received", "rows_accepted")} == {
        "rows_sent": 16, "bytes_sent": 150, "rows_received": 6, "rows_accepted": 4,
    }  # fmt: skip
    assert ledger.accepted_by_peer == {"a": 4} and ledger.refused == {"stale": 2}
    ledger.add_sources(["b", "a"])
    ledger.add_sources(["a", "c"])
    assert ledger.sources == ["b", "a", "c"] and ledger.source_index("b") == 1 and ledger.source_index("c") == 3
    assert ledger.peers() == ["a", "b", "c"]


def test_state_round_trips_without_the_warnings():
    ledger = PeerRowLedger()
    ledger.record_round(rows_sent=8, bytes_sent=100, rows_received=6, accepted=rows("a", 4), refused={"stale": 2})
    ledger.count("a", "too_long", 2)
    ledger.step_row_counts()
    ledger.count("a", "bad_ids")
    ledger.add_sources(["a"])
    ledger.totals["rows_filtered"] += 3
    restored = PeerRowLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.state_dict() == ledger.state_dict()
    assert restored.dropped == {"bad_ids": 1} and restored.row_count_keys == {"dropped/too_long"}
    assert not restored.warned("a", "too_long")  # a restarted peer warns again


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.pop("totals"),
        lambda s: s["refused"].update(stale=-1),
        lambda s: s.update(accepted_by_peer=["a"]),
        lambda s: s.update(row_count_keys=[3]),
    ],
)
def test_a_malformed_state_raises_and_changes_nothing(change):
    ledger = PeerRowLedger()
    ledger.count("a", "too_long", 2)
    state = ledger.state_dict()
    broken = {key: (dict(value) if isinstance(value, dict) else value) for key, value in state.items()}
    change(broken)
    with pytest.raises(ValueError):
        ledger.load_state_dict(broken)
    assert ledger.state_dict() == state


def test_totals_and_refusals_are_added_through_the_ledger_and_unknown_totals_are_refused():
    ledger = PeerRowLedger()
    ledger.add("rows_filtered", 3)
    ledger.add("rows_retokenised", 2)
    ledger.refuse("unknown_prompt", 4)
    assert ledger.totals["rows_filtered"] == 3 and ledger.totals["rows_retokenised"] == 2
    assert ledger.refused == {"unknown_prompt": 4}
    assert ledger.state_dict()["refused"] == {"unknown_prompt": 4}
    with pytest.raises(KeyError, match="rows_typo"):
        ledger.add("rows_typo", 1)
