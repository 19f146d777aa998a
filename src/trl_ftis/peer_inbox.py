"""The rows a caller hands a trainer with `FTISTrainer.add_peer_rows`: [`PeerInbox`] checks them (a caller's
programming errors raise before anything is queued), admits them (`trl_ftis.swarm.admission.Admission`: dropped and
counted, or kept as `AdmittedRow`s), queues at most a bounded number, and hands a step at most its cap, as whole
groups. It owns the queue, which a checkpoint saves and a resumed run restores."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .peer_rows import AdmittedRow, PeerRow, check_rows, row_type_problem, take_rows

__all__ = ["PeerInbox"]


class PeerInbox:
    """The queue of admitted rows added by the trainer's caller.

    Args:
        admission: admits the rows (`Admission.admit`) and restores saved ones (`Admission.restore`).
        ledger: rows beyond the bound are counted there (`queue_full`).
        lock: the round runner's lock (an async worker's admission uses the tokenizer and the ledger too).
        vocab_limit: the ids a row of this trainer's tokenizer may hold.
        cross_tokenizer: rows in another tokenizer's tokens are allowed (`FTISConfig.cross_tokenizer`).
        bound (`Callable[[], int]`): the rows the queue holds at most (4 steps' worth: memory stays bounded).
    """

    def __init__(self, *, admission, ledger, lock, vocab_limit: int, cross_tokenizer: bool, bound: Callable[[], int]):
        self.admission, self.ledger, self.lock = admission, ledger, lock
        self.vocab_limit, self.cross_tokenizer, self.bound = vocab_limit, cross_tokenizer, bound
        self.rows: list[AdmittedRow] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Iterable[PeerRow]) -> int:
        """Check, admit and queue `rows` (see `FTISTrainer.add_peer_rows`); returns the rows queued."""
        rows = list(rows)
        for row in rows:
            problem = row_type_problem(row)
            if problem is not None:
                raise TypeError(problem)
        foreign = [row for row in rows if row.foreign_tokenizer]
        if foreign and not self.cross_tokenizer:
            raise ValueError(
                f"PeerRow from {foreign[0].sender!r} is in another tokenizer's tokens (foreign_tokenizer=True), but "
                "cross_tokenizer is off: set FTISConfig(cross_tokenizer=True) to train on such rows."
            )
        own_tokens = [row for row in rows if not row.foreign_tokenizer]
        if own_tokens:
            check_rows(own_tokens, self.vocab_limit)
        with self.lock:
            kept = self.admission.admit(rows)
            room = max(self.bound() - len(self.rows), 0)
            self.ledger.count_trimmed((row.sender for row in kept[room:]), "queue_full")
            self.rows.extend(kept[:room])
        return min(len(kept), room)

    def take(self, most: int | None) -> list[AdmittedRow]:
        """At most `most` queued rows (`None`: all), as whole groups in queue order; the rest stays queued."""
        with self.lock:
            taken, self.rows = take_rows(self.rows, most)
        return taken

    def restore(self, saved: list) -> None:
        """Queue again, first, the rows a checkpoint saved (checked by `trl_ftis.swarm.checkpoint`), admitted again."""
        with self.lock:
            self.rows = self.admission.restore(saved) + self.rows
