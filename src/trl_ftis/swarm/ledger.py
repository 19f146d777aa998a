"""The peer-row ledger: every count a trainer keeps about peer rows, in one owner.

[`PeerRowLedger`] holds the totals behind `FTISTrainer.summary()` (rows sent, received, accepted, filtered and
re-tokenised, bytes sent), the messages refused and rows dropped by reason, the rows dropped (and changed) since the
last merge, the rows trained on per peer, the peers that the loss metrics index (`ftis_source`), and the warn-once
bookkeeping of drops. The admission, the swarm round and the merge write to it; the trainer reads it for its metrics,
summary and model card; the checkpoint saves [`PeerRowLedger.state_dict`] and restores it with
[`PeerRowLedger.load_state_dict`], which checks the whole state first (a malformed one raises `ValueError` and
changes nothing).

The ledger is not thread-safe by itself: with `exchange_mode="async"` its writers hold the round runner's lock
(`trl_ftis.swarm.rounds.RoundRunner.lock`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

TOTALS = ("rows_sent", "rows_received", "rows_accepted", "rows_filtered", "bytes_sent", "rows_retokenised")
"""The totals of `summary()`, in its order."""
COUNTERS = ("refused", "dropped", "dropped_since_merge", "stripped_since_merge", "accepted_by_peer")
"""The counters of a state, by name."""
MAX_WARNED = 1000
"""(peer, reason) pairs warned about: bounded like the swarm's warnings."""
MAX_NAMED_PEERS = 64
"""Peers with metrics of their own (`ftis/peers/<peer>/...`); the rest are counted together as [`OTHER_PEERS`]."""
QUIET_DROPS = frozenset({"special_tokens", "text_special_tokens"})
"""Drop reasons that honest peers hit now and then: a sampled model writes its padding or unknown token inside a
completion (untrained and tiny models do, about 1 row in 500 after the tiny warm-up), which every receiver drops
(`trl_ftis.swarm.admission`). A rare such drop is counted like any other (`ftis/peer_rows_dropped/<reason>`, the
summary's `dropped`) and logged at info level: a console warning for it would be noise in every swarm. When it takes
more than [`RARE_SHARE`] of a sender's rows at once (a mismatched end-of-sequence token, injected markers), it is
warned about as any drop is."""
RARE_SHARE = 0.1
"""At most this share of a sender's rows in one admission stage (and always a single row) is a rare drop."""
OTHER_PEERS = "(others)"
"""The name every peer beyond [`MAX_NAMED_PEERS`] is counted under (no valid peer id has parentheses)."""

Row = TypeVar("Row")


@dataclass(frozen=True)
class LedgerState:
    """A checked ledger state ([`PeerRowLedger.parse_state`]), ready to be loaded."""

    totals: dict[str, int]
    counters: dict[str, dict[str, int]]
    row_count_keys: list[str]
    sources: list[str]


def is_rare_drop(count: int, of: int | None) -> bool:
    """Whether dropping `count` of a sender's `of` rows is rare: a single row, or at most [`RARE_SHARE`] of them
    (unknown `of`: only a single row)."""
    return count <= max(1, int(RARE_SHARE * (of or 0)))


class PeerRowLedger:
    """The counters of peer rows: totals, refusals and drops by reason, per-peer counts, the loss metrics' peer list,
    and the warning shown once per (peer, reason).

    Args:
        drop_reasons (`Mapping[str, str]`, *optional*):
            Reason -> the text its warning shows (the trainer passes `trl_ftis.swarm.admission.DROP_REASONS`); a reason
            without one is shown by name.
        strip_reasons (`Mapping[str, str]`, *optional*):
            The same for rows changed and kept (`trl_ftis.swarm.admission.STRIP_REASONS`).
    """

    def __init__(self, drop_reasons: Mapping[str, str] | None = None, strip_reasons: Mapping[str, str] | None = None):
        self._descriptions = {False: dict(drop_reasons or {}), True: dict(strip_reasons or {})}
        self.totals: dict[str, int] = dict.fromkeys(TOTALS, 0)
        self.refused: Counter = Counter()  # messages refused by the swarm (and unknown prompts), by reason
        self.dropped_totals: Counter = Counter()  # rows dropped since the run started, by reason
        self.dropped: Counter = Counter()  # rows dropped since the last merge, by reason
        self.stripped: Counter = Counter()  # rows whose reserved columns were removed since the last merge
        self.accepted_by_peer: Counter = Counter()  # swarm rows trained on, per sender
        self.row_count_keys: set[str] = set()  # "dropped/<reason>" and "stripped/<reason>" seen so far
        self.sources: list[str] = []  # index k >= 1 in `ftis_source` is sources[k - 1]
        self._round_named: set[str] = set()  # senders named in the round metrics (main process), see `peer_name`
        self._warned: set[tuple[str, str]] = set()
        self._noted: set[tuple[str, str]] = set()  # rare quiet drops said at info level (`QUIET_DROPS`)

    def learn_reasons(self, drop_reasons: Mapping[str, str]) -> None:
        """Add reasons for dropping rows that a part of the run counts on its own (an exchange mode's
        `drop_reasons`), with the text their warning shows. A reason already known with another text is refused
        (`ValueError`): one reason, one meaning."""
        known = self._descriptions[False]
        for reason, text in drop_reasons.items():
            if known.get(reason, text) != text:
                raise ValueError(f"The drop reason {reason!r} already means something else: {known[reason]!r}")
        known.update(drop_reasons)

    # -- drops ------------------------------------------------------------------------------------------------------
    def count(
        self,
        sender: Any,
        reason: str,
        count: int = 1,
        *,
        stripped: bool = False,
        detail: str = "",
        of: int | None = None,
    ) -> None:
        """Count `count` rows of `sender` dropped for `reason` (or, with `stripped`, changed and kept); warn the first
        time for each (peer, reason), for at most [`MAX_WARNED`] pairs. `of`: the sender's rows they were among; a
        rare drop for a reason of [`QUIET_DROPS`] is logged at info level instead ([`is_rare_drop`])."""
        if stripped:
            self.stripped[reason] += count
        else:
            self.dropped[reason] += count
            self.dropped_totals[reason] += count
        kind = "stripped" if stripped else "dropped"
        key = (str(sender)[:200], f"{kind}/{reason}")
        quiet = not stripped and reason in QUIET_DROPS and is_rare_drop(count, of)
        said = self._noted if quiet else self._warned
        if key in said or len(said) >= MAX_WARNED:
            return
        said.add(key)
        logger.log(
            logging.INFO if quiet else logging.WARNING,
            "%s %d peer row(s) from %r: %s%s. Counted in ftis/peer_rows_%s/%s; not logged again for this peer and "
            "reason.",
            "Changed" if stripped else "Dropped",
            count,
            key[0],
            self._descriptions[bool(stripped)].get(reason, reason),
            f" ({detail})" if detail else "",
            kind,
            reason,
        )

    def warned(self, sender: Any, reason: str) -> bool:
        """Whether the drop of `sender`'s rows for `reason` was warned about already."""
        return (str(sender)[:200], f"dropped/{reason}") in self._warned

    @property
    def num_warned(self) -> int:
        """How many (peer, reason) pairs were warned about."""
        return len(self._warned)

    def sift(
        self,
        rows: Sequence[Row],
        problems: Sequence[str | None],
        details: Mapping[tuple[str, str], str] | None = None,
    ) -> list[Row]:
        """The rows whose problem is `None`; the others (anything with a `sender`) are counted by (sender, reason).
        `details` adds a text to the warning of a (sender, reason)."""
        details = details or {}
        kept, counts, senders = [], Counter(), Counter()
        for row, problem in zip(rows, problems, strict=True):
            senders[str(row.sender)] += 1
            if problem is None:
                kept.append(row)
            else:
                counts[(str(row.sender), problem)] += 1
        for (sender, reason), count in counts.items():
            self.count(sender, reason, count, detail=details.get((sender, reason), ""), of=senders[sender])
        return kept

    def count_trimmed(self, senders: Iterable[Any], reason: str = "batch_split") -> None:
        """Count rows left out (one sender each, e.g. the rows that did not split evenly), by sender."""
        for sender, count in Counter(str(sender) for sender in senders).items():
            self.count(sender, reason, count)

    # -- rounds, steps and peers ------------------------------------------------------------------------------------
    def record_round(
        self, *, rows_sent: int, bytes_sent: int, rows_received: int, accepted: Sequence[Any], refused: Mapping
    ) -> None:
        """One swarm round: what was published, received and accepted (rows with a `sender`), and what was refused."""
        self.totals["rows_sent"] += rows_sent
        self.totals["bytes_sent"] += bytes_sent
        self.totals["rows_received"] += rows_received
        self.record_accepted(accepted)
        self.refused.update(refused)

    def record_accepted(self, accepted: Sequence[Any]) -> None:
        """Swarm rows taken to be trained on (rows with a `sender`): in the free mode, when a step takes
        them from the queue of arrived rows rather than when their round is collected."""
        self.totals["rows_accepted"] += len(accepted)
        self.accepted_by_peer.update(row.sender for row in accepted)

    def add(self, total: str, count: float) -> None:
        """Add `count` to the total `total` (one of [`TOTALS`]: `rows_filtered` after an optimizer step,
        `rows_retokenised` after a re-tokenisation); `KeyError` for another name."""
        if total not in self.totals:
            raise KeyError(f"{total!r} is not a total of the ledger ({', '.join(TOTALS)})")
        self.totals[total] += count

    def refuse(self, reason: str, count: int = 1) -> None:
        """Count `count` refusals for `reason` that the swarm did not make (`unknown_prompt`: the admission's)."""
        self.refused[reason] += count

    def step_row_counts(self) -> dict[str, float]:
        """This step's dropped (and changed) peer rows as metrics, and a fresh count for the next step: the total
        (`ftis/peer_rows_dropped`) and one metric per reason seen so far (`ftis/peer_rows_dropped/<reason>`,
        `ftis/peer_rows_stripped/<reason>`; 0 when none this step)."""
        dropped, stripped = self.dropped, self.stripped
        self.dropped, self.stripped = Counter(), Counter()
        metrics = {"ftis/peer_rows_dropped": float(sum(dropped.values()))}
        self.row_count_keys.update(f"dropped/{reason}" for reason in dropped)
        self.row_count_keys.update(f"stripped/{reason}" for reason in stripped)
        for key in sorted(self.row_count_keys):
            kind, reason = key.split("/", 1)
            metrics[f"ftis/peer_rows_{key}"] = float((dropped if kind == "dropped" else stripped)[reason])
        return metrics

    def add_sources(self, senders: Iterable[str]) -> None:
        """Add the peers not yet in [`sources`], in order (the same list on every process). The first
        [`MAX_NAMED_PEERS`] get their own source (and `ftis/peers/<peer>/...` loss metrics); later ones share
        [`OTHER_PEERS`], so invented sender ids cannot grow the metrics or the loss's per-source sums without bound."""
        for sender in senders:
            if sender in self.sources:
                continue
            named = len(self.sources) - (OTHER_PEERS in self.sources)
            if named < MAX_NAMED_PEERS:
                self.sources.append(sender)
            elif OTHER_PEERS not in self.sources:
                self.sources.append(OTHER_PEERS)

    def source_index(self, sender: str) -> int:
        """`ftis_source` of a row of `sender`: 1 + its place in [`sources`] (0 is this trainer's own rows); a sender
        without a source of its own counts under [`OTHER_PEERS`]."""
        name = sender if sender in self.sources else OTHER_PEERS
        return self.sources.index(name) + 1

    def peer_name(self, sender: str) -> str:
        """The name of `sender` in the round's per-peer metrics (`ftis/peers/<name>/rows_received`, ...): its own for
        the first [`MAX_NAMED_PEERS`] senders seen (and those with a source), [`OTHER_PEERS`] for the rest."""
        if sender in self._round_named or sender in self.sources:
            return sender
        if len(self._round_named) < MAX_NAMED_PEERS:
            self._round_named.add(sender)
            return sender
        return OTHER_PEERS

    def peers(self) -> list[str]:
        """Every peer whose rows were merged or whose swarm rows were accepted, sorted."""
        return sorted(set(map(str, self.sources)) | set(map(str, self.accepted_by_peer)))

    # -- state --------------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The ledger as JSON-serialisable values (the checkpoint's `totals` ... `sources`; the warn-once set is not
        saved: a restarted peer warns again)."""
        return {
            "totals": {key: self.totals[key] for key in TOTALS},
            "refused": dict(self.refused),
            "dropped": dict(self.dropped_totals),
            "dropped_since_merge": dict(self.dropped),
            "stripped_since_merge": dict(self.stripped),
            "accepted_by_peer": dict(self.accepted_by_peer),
            "row_count_keys": sorted(self.row_count_keys),
            "sources": list(self.sources),
        }

    @staticmethod
    def parse_state(state: Any) -> LedgerState:
        """Check a [`state_dict`] (read from a file): `ValueError` naming what is wrong; nothing is changed."""
        if not isinstance(state, Mapping):
            raise ValueError("not a JSON object")  # noqa: TRY004 - a malformed file, not a wrong argument
        totals = _numbers(state.get("totals"), "totals")
        if set(totals) != set(TOTALS):
            raise ValueError(f"'totals' must have exactly {', '.join(TOTALS)}")
        counters = {name: _numbers(state.get(name), name) for name in COUNTERS}
        keys, sources = state.get("row_count_keys"), state.get("sources")
        for name, value in (("row_count_keys", keys), ("sources", sources)):
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise ValueError(f"{name!r} is not a list of strings")
        return LedgerState(totals=totals, counters=counters, row_count_keys=list(keys), sources=list(sources))

    def load_state_dict(self, state: Any) -> None:
        """Restore a [`state_dict`] (or a [`LedgerState`] already checked): checked first, so that a malformed state
        raises `ValueError` and changes nothing."""
        parsed = state if isinstance(state, LedgerState) else self.parse_state(state)
        self.totals.update(parsed.totals)
        self.refused = Counter(parsed.counters["refused"])
        self.dropped_totals = Counter(parsed.counters["dropped"])
        self.dropped = Counter(parsed.counters["dropped_since_merge"])
        self.stripped = Counter(parsed.counters["stripped_since_merge"])
        self.accepted_by_peer = Counter(parsed.counters["accepted_by_peer"])
        self.row_count_keys = set(parsed.row_count_keys)
        self.sources = list(parsed.sources)


def _numbers(value: Any, name: str) -> dict[str, int]:
    # 0 <= count < 2**63 also refuses inf and NaN (a file's JSON may hold them) and integers no float can hold.
    if not isinstance(value, Mapping) or not all(
        isinstance(key, str) and isinstance(count, (int, float)) and not isinstance(count, bool) and 0 <= count < 2**63
        for key, count in value.items()
    ):
        raise ValueError(f"{name!r} is not a mapping of names to non-negative counts")
    return {key: int(count) for key, count in value.items()}
