"""Swarm rounds: publish this peer's rows, collect the other peers' rows, refuse what must not be trained on.

One [`Swarm`] per training job, used by the main process only. Every round it publishes the job's freshly
sampled rows as one signed message, then collects what the other peers published: it waits for the expected peers
(up to `peer_timeout`), drops messages outside the round window and foreign ones, and turns the rest into
[`trl_ftis.PeerRow`] s. Nothing a peer sends can stop the round: a bad message is counted, logged once per peer and
reason, and skipped.

The round protocol (`docs/swarm.md`, "The round protocol"):

* every message is decoded once, and its signatures are verified before anything in it is parsed
  ([`trl_ftis.exchange.decode_message`]); the transport's metadata (`sender_hint`, `round_hint`) is never trusted:
  it orders the work and picks the allowance an envelope draws from, and a message it misdescribes can only be
  skipped or refused (`sender_hint`), never taken as another sender's;
* rounds are the only clock: a message is taken when its round is in `[round - max_staleness,
  round + max_rounds_ahead]` (reasons `stale`, `ahead`), whatever its `created` time says; a peer that finds the
  swarm far ahead of it (it joined late, stalled or resumed an older checkpoint) moves its round forward to the
  swarm's, once live peers show it (`trl_ftis.swarm.exchange_modes.sync_window.SyncWindow.align`);
* a message is used once: identical bytes delivered again are refused (`duplicate`), and nothing else is, so no
  one can pre-empt a peer's own message by sending first under its name;
* every round has a budget ([`RoundBudget`]): what each sender, all newcomers together, and all senders together
  may cost in messages, bytes, rows and seconds; envelopes beyond it are dropped unread (`round_budget`);
* with per-peer keys, a message must be signed by the key registered for the sender it names (`unknown_peer`,
  `signature`, `identity`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..exchange import ExchangeError, Limits, Message, decode_message, encode_message, is_signed
from ..exchange.transports import Transport, open_transport
from ..message_trust import CREDENTIAL_HINT, CREDENTIAL_REASONS
from ..peer_rows import PeerRow
from ..redaction import redact_url
from ..round_window import (
    DEFAULT_MAX_ROUNDS_AHEAD,
    DEFAULT_MAX_STALENESS,
    DEFAULT_PEER_TIMEOUT,
    check_expected_peers,
    check_round_window,
)
from ..sampling_bounds import check_temperature
from .clocks import EPOCH_LEAD_LIMIT, epoch_lead, now_epoch, start_epoch
from .exchange_modes.sync_window import SyncWindow
from .message_checks import load_keys, tokenizer_problem
from .peer_messages import biased_logps, fits_the_wire, message_to_rows, rows_to_message
from .reading_order import reading_order
from .round_budget import BUDGET_TEXT, RoundBudget, RoundResult, RoundSpending, whole_groups
from .round_windows import MAX_KNOWN_PEERS
from .swarm_state import check_swarm_state

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

logger = logging.getLogger(__name__)

__all__ = ["Swarm"]

# Seconds `leave` retries its message at most (a Redis server that is down): the run is ending, and a peer that never
# hears of it stops waiting after one peer_timeout anyway.
LEAVE_PATIENCE = 1.0
# Collects with nothing accepted from anyone, after which a peer says it may be alone on its exchange.
LONELY_COLLECTS = 5


class Swarm:
    """This peer's connection to the swarm: one transport, one identity, the refusal rules.

    Args:
        url: the exchange URL (`dir://`, `redis://`, `rediss://`, `memory://`).
        peer_id: this peer's id; its own messages are skipped when collecting.
        tokenizer_fingerprint / tokenizer_name: what this peer's tokenizer is; peers with another fingerprint
            are refused (their token ids mean other tokens here).
        vocab_limit: token ids must be below it.
        temperature: the sampling temperature, in `[MIN_TEMPERATURE, MAX_TEMPERATURE]`; log-probs at
            another temperature are not comparable.
        reward_names: names of this peer's reward functions (sent with per-function rewards).
        secret: the swarm secret; when set, every message is signed (HMAC) and unsigned or wrongly signed ones are
            refused. It proves membership: any member can sign as any other.
        expected_peers / num_expected_peers: whom a round waits for, up to `peer_timeout` seconds: the named peers
            (this peer's own id among them is ignored), or, alternatively, a number of other peers whatever their
            ids; `ValueError` when both are given (`check_expected_peers`).
        max_staleness: messages from rounds older than `round - max_staleness` are dropped (`stale`).
        compact: send 16-bit, compressed messages.
        keep_rounds: own messages older than this many rounds are removed from the exchange.
        model_name: this peer's model (name or path), sent along so that peers can name it in summaries and model
            cards; received names are in `peer_models`.
        limits: what one message may hold ([`trl_ftis.exchange.Limits`]; tight ones from `Limits.for_receiver`),
            applied when decoding and when encoding (what this peer sends decodes at a peer with the same limits);
            the transport opened on `url` refuses messages over `limits.max_message_bytes` unread. Default:
            `Limits()`, which accepts anything a sane peer sends.
        private_key: this peer's Ed25519 private key (a key, or the path of its PEM file): every message is signed
            with it, so that peers holding the swarm's public keys can tell it was written by this peer.
        public_keys: peer id -> Ed25519 public key (a mapping, or the path of the swarm's public-key file,
            [`trl_ftis.exchange.load_public_keys`]). When given, every message must be signed by the key registered
            for the sender it names (refused: `unsigned`, `unknown_peer`, `signature`, `identity`): a member holding
            the swarm secret can no longer write as another.
        max_rounds_ahead: messages from rounds later than `round + max_rounds_ahead` are dropped (`ahead`).
        budget: what one round may cost ([`RoundBudget`]).
        cross_tokenizer: accept peers with another tokenizer fingerprint when their messages carry completion texts
            (their rows come out marked `foreign_tokenizer`, to be re-tokenised by the trainer); token ids are then
            checked against `vocab_limit` only for peers that share this tokenizer. Off: such peers are refused
            (`tokenizer`).
        swarm_name / run_id: the swarm and the run of it this peer belongs to (`FTISConfig.swarm_name`, `swarm_run`).
            Every message it sends names them, inside what is signed, and every message it receives must name the same
            ones (refused: `swarm`, `run`), so that messages of another swarm, or of an earlier run of this one
            (replayed, or left in a reused exchange), are refused before their body is read. Without `run_id`,
            catch-up evidence ([`SyncWindow.align`]) counts only from messages stamped at most `EVIDENCE_CLOCK_SLACK`
            seconds before this peer started.
        window: builds the round window this swarm reads through, with the swarm as its host
            (`trl_ftis.swarm.round_windows`: `RoundWindow`, `WindowHost`); the exchange mode's `window`. Default: the
            sync window ([`SyncWindow`]: one shared round, waiting and catch-up). The free mode's
            (`trl_ftis.swarm.exchange_modes.free_window.FreeWindow`) takes each sender in its own order and never
            waits.
        order_key: keys the order in which senders that cannot all be read are read ([`sender_rank`]); default:
            16 random bytes, so that no writer can predict it. Give one only to make that order reproducible (tests).
    """

    def __init__(
        self,
        url: str,
        *,
        peer_id: str,
        tokenizer_fingerprint: str,
        tokenizer_name: str,
        vocab_limit: int,
        temperature: float,
        reward_names: Sequence[str],
        secret: str | bytes | None = None,
        expected_peers: Sequence[str] | None = None,
        num_expected_peers: int | None = None,
        peer_timeout: float = DEFAULT_PEER_TIMEOUT,
        max_staleness: int = DEFAULT_MAX_STALENESS,
        compact: bool = False,
        keep_rounds: int | None = None,
        transport: Transport | None = None,
        model_name: str = "",
        limits: Limits | None = None,
        private_key: Ed25519PrivateKey | str | os.PathLike | None = None,
        public_keys: Mapping[str, Ed25519PublicKey] | str | os.PathLike | None = None,
        max_rounds_ahead: int = DEFAULT_MAX_ROUNDS_AHEAD,
        budget: RoundBudget | None = None,
        cross_tokenizer: bool = False,
        window: type = SyncWindow,
        swarm_name: str | None = None,
        run_id: str | None = None,
        order_key: bytes | None = None,
    ):
        self.url = url
        self.swarm_name = swarm_name or None
        self.run_id = run_id or None
        self.peer_id = peer_id
        self.fingerprint = tokenizer_fingerprint
        self.tokenizer_name = tokenizer_name
        self.vocab_limit = vocab_limit
        self.temperature = check_temperature(temperature)
        self.reward_names = list(reward_names)
        self.secret = secret or None
        check_expected_peers(expected_peers, num_expected_peers)
        self.expected_peers = sorted(set(expected_peers or []) - {peer_id})
        self.num_expected_peers = num_expected_peers
        self.peer_timeout = float(peer_timeout)
        self.max_staleness, self.max_rounds_ahead = check_round_window(max_staleness, max_rounds_ahead)
        self.compact = compact
        self.cross_tokenizer = bool(cross_tokenizer)
        self.keep_rounds = keep_rounds if keep_rounds is not None else max_staleness + 2
        self.limits = limits if limits is not None else Limits()
        if not isinstance(self.limits, Limits):
            raise TypeError(f"limits must be a trl_ftis.exchange.Limits, got {type(limits).__name__}")
        self.budget = budget if budget is not None else RoundBudget()
        self.private_key, self.public_keys = load_keys(private_key, public_keys, peer_id, self.expected_peers)
        self.transport = transport if transport is not None else self._open()
        self.known_peers: set[str] = set()
        self.model_name = model_name
        self.peer_models: dict[str, str] = {}  # sender -> the model it reported (accepted messages only)
        self.sampling: dict[str, Any] = {}  # `Message.sampling` of what this peer publishes (its trainer sets it)
        self.unpublished: Counter = Counter()
        """Own rows not published, by reason (`out_of_range`, an encoding reason such as `too_large`, or the
        transport error's type)."""
        self.departed: dict[str, int] = {}
        """Peers that announced they are leaving (a verified final message, [`leave`]) -> the round of that message:
        never waited for, until they deliver a message of a later round (they restarted)."""
        self._last_round: int | None = None  # the swarm round of this peer's newest publish; `leave` names it
        # Digest -> round of every message accepted in the round window: identical bytes delivered again (a retried
        # Redis publish, a directory read again after `reopen`) are used once. Distinct messages are never refused
        # as duplicates, so no one can pre-empt a peer's own message by writing first under its name.
        self._seen: dict[bytes, int] = {}
        # This peer's swarm round is its step + `round_offset`, which the sync window moves forward when it
        # finds the swarm far ahead (`SyncWindow.align`).
        self.round_offset = 0
        # Newest round of an accepted message per sender: a peer one round ahead may deliver round r + 1 while this
        # peer collects round r; in round r + 1 it has then delivered already and is not waited for again.
        self._delivered: dict[str, int] = {}
        self.epoch = now_epoch()
        """This start of this peer, sent in every message (`Message.epoch`): microseconds since 1970, kept above the
        epoch of any state it resumed from ([`load_state_dict`]), so that every start of a peer has a newer one."""
        self.order_key = os.urandom(16) if order_key is None else bytes(order_key)
        """Keys the order in which this peer reads senders it cannot all read ([`sender_rank`]): random, never sent
        or saved, so no writer can grind ids or hints that this peer reads first."""
        self._warned: set[tuple[str, str]] = set()
        self._closed = False
        self._collects = 0  # collects so far ([`_say_if_alone`])
        self._interrupted = threading.Event()  # set by `interrupt`: a round stops waiting for peers
        self.window = window(self)

    def _open(self) -> Transport:
        return open_transport(self.url, max_message_bytes=self.limits.max_message_bytes)

    # -- publishing ----------------------------------------------------------------------------------------------
    def publish(self, rows: Sequence[PeerRow], round: int) -> int:
        """Publish this peer's rows of `round` (its step: the message carries the swarm round, `round +
        round_offset`); returns the bytes sent (0 when nothing was).

        Never raises: a group holding a value the wire format refuses (a reward beyond `limits.max_abs_reward`, a
        log-prob below `limits.min_logp`, ...) is left out, a message that cannot be encoded or sent at all is not
        sent; each is logged once per reason and counted in `unpublished`."""
        if not rows:
            return 0
        round = int(round) + self.round_offset
        self._last_round = round
        rows = self._wire_safe(rows, round)
        if not rows:
            return 0
        try:
            message = rows_to_message(
                rows,
                sender=self.peer_id,
                round=round,
                tokenizer_fingerprint=self.fingerprint,
                tokenizer_name=self.tokenizer_name,
                temperature=self.temperature,
                reward_names=self.reward_names,
                model=self.model_name,
            )
            message.swarm, message.run, message.epoch = self.swarm_name or "", self.run_id or "", self.epoch
            message.sampling = dict(self.sampling)
            data = encode_message(
                message, secret=self.secret, private_key=self.private_key, compact=self.compact, limits=self.limits
            )
        except Exception as error:  # noqa: BLE001 - our rows are lost for the others this round, our run goes on
            reason = error.reason if isinstance(error, ExchangeError) else type(error).__name__
            self.unpublished[reason] += len(rows)
            self.warn_once(
                "publish",
                f"encode:{reason}",
                f"Could not encode this peer's rows of round {round} ({error}); they are not shared this round "
                "(logged once per reason; counted in Swarm.unpublished).",
                level=logging.ERROR,
            )
            return 0
        try:
            self.transport.publish(data, sender=self.peer_id, round=round)
        except Exception as error:  # noqa: BLE001 - a lost message costs the others one round of our rows, not our run
            self.unpublished[type(error).__name__] += len(rows)
            self.warn_once("publish", type(error).__name__, f"Could not publish round {round}: {error}")
            return 0
        try:
            self.transport.prune(sender=self.peer_id, keep_rounds=self.keep_rounds, current_round=round)
        except Exception as error:  # noqa: BLE001 - sent all the same; old messages are only refused as stale
            self.warn_once(
                "prune",
                type(error).__name__,
                f"Could not remove this peer's old messages from the exchange ({error}); the message of round "
                f"{round} was sent. Receivers refuse old ones as stale (e.g. a Redis ACL without XDEL).",
            )
        return len(data)

    def leave(self, round: int | None = None) -> bool:
        """Tell the other peers that this one is leaving: one signed message with no rows, marked `final`, of
        `round` (this peer's step; default: the round after its newest publish, the one the others wait for it in),
        so that they stop waiting for it at once instead of after `peer_timeout`. Called when a trainer's `train()`
        ends; a later message of a later round (a restart) makes them wait for it again. Never raises, and retries a
        failing send for at most `LEAVE_PATIENCE` seconds (a Redis server that is down); returns whether the message
        was sent."""
        if self._closed:
            return False
        if round is not None:
            swarm_round = int(round) + self.round_offset
        else:
            swarm_round = self.round_offset if self._last_round is None else self._last_round + 1
        message = Message(
            sender=self.peer_id,
            round=max(swarm_round, 0),
            tokenizer_fingerprint=self.fingerprint,
            tokenizer_name=self.tokenizer_name,
            temperature=self.temperature,
            reward_names=self.reward_names,
            groups=[],
            completions=[],
            model=self.model_name,
            final=True,
            swarm=self.swarm_name or "",
            run=self.run_id or "",
            epoch=self.epoch,
        )
        try:
            data = encode_message(message, secret=self.secret, private_key=self.private_key, limits=self.limits)
            self.transport.publish(data, sender=self.peer_id, round=message.round, patience=LEAVE_PATIENCE)
        except Exception as error:  # noqa: BLE001 - the others then stop waiting after one peer_timeout, as for a crash
            self.warn_once("publish", f"leave:{type(error).__name__}", f"Could not announce leaving: {error}")
            return False
        logger.info("Peer %r: announced leaving the swarm (round %d).", self.peer_id, message.round)
        return True

    def _wire_safe(self, rows: Sequence[PeerRow], round: int) -> list[PeerRow]:
        """`rows` without the groups holding a value the wire format refuses (receivers would refuse the whole
        message): a whole group goes, since receivers normalise advantages within it."""
        limits, bad_groups = self.limits, set()
        for row in rows:
            if row.group not in bad_groups and not fits_the_wire(row, self.reward_names, limits):
                bad_groups.add(row.group)
        if not bad_groups:
            return list(rows)
        kept = [row for row in rows if row.group not in bad_groups]
        self.unpublished["out_of_range"] += len(rows) - len(kept)
        self.warn_once(
            "publish",
            "out_of_range",
            f"Round {round}: {len(bad_groups)} group(s) of own rows hold a reward beyond +-{limits.max_abs_reward:g}, "
            f"a log-prob below {limits.min_logp:g} or a non-finite value, which the wire format refuses; they are "
            "not shared (logged once; counted in Swarm.unpublished['out_of_range']).",
        )
        return kept

    # -- collecting ----------------------------------------------------------------------------------------------
    @property
    def waits(self) -> bool:
        """Whether a round waits for expected peers (as the window decides: never in the free mode)."""
        return self.window.waits

    def regulars(self) -> frozenset[str]:
        """The senders served first, each with its own allowance: `expected_peers` when given, else the peers of
        the public keys, else the peers accepted in earlier rounds (see [`RoundBudget`])."""
        return self.listed_peers() or frozenset(self.known_peers)

    def listed_peers(self) -> frozenset[str]:
        """The peers this one was told of: `expected_peers` when given, else the peers of the public keys."""
        if self.expected_peers:
            return frozenset(self.expected_peers)
        if self.public_keys is not None:
            return frozenset(self.public_keys) - {self.peer_id}
        return frozenset()

    def collect(self, round: int, *, max_rows: int | None = None, share: int | None = None) -> RoundResult:
        """Collect what arrived for `round`. Waits for the expected peers (each must deliver something new) at most
        `peer_timeout` seconds, then reads what is left in the exchange for at most `budget.max_seconds`; never
        raises because of what a peer sent.

        Args:
            round: this peer's step; the round window is taken around its swarm round, `round + round_offset`
                (`round_offset` moves forward when this peer finds the swarm far ahead of it: [`SyncWindow.align`]).
            max_rows: rows to accept at most this round (all senders together); default `budget.max_rows`. A
                trainer that keeps `cap` rows a round passes a few times `cap`, so that selection can still be fair.
            share: rows reserved at least for each regular, and for the newcomers together, this round (a message
                beyond its sender's share and the unreserved rows is cut to whole groups: [`RoundSpending`]); the
                share is `max_rows // (regulars + 1)` when that is more. A larger one raises `max_rows` to `share *
                (regulars + 1)`. A trainer passes the rows it publishes a round, which an honest peer sends too.
        """
        round = int(round) + self.round_offset
        regulars = self.regulars()
        result = RoundResult(regulars=regulars)
        start = time.monotonic()
        deadline = start + self.peer_timeout
        budget = self.budget
        per_sender = budget.messages_per_sender or self.max_staleness + self.max_rounds_ahead + 1
        rows_cap = budget.max_rows if max_rows is None else max(int(max_rows), 0)
        if share is not None:
            rows_cap = max(rows_cap, max(int(share), 0) * (len(regulars) + 1))
        # A round that waits may read until its wait is over, and then for `max_seconds`; one that does not wait, for
        # `max_seconds` from its start.
        state = RoundSpending(
            budget, regulars, per_sender, rows_cap, (deadline if self.waits else start) + budget.max_seconds, share
        )
        state.window = self.window.begin()
        self.forget(round)
        fresh: set[str] = {sender for sender, newest in self._delivered.items() if newest >= round}
        dropped: Counter = Counter()
        while True:
            try:
                envelopes = self.transport.poll()
            except Exception as error:  # noqa: BLE001 - any transport failure: train on what arrived
                self.warn_once("transport", type(error).__name__, f"Polling the exchange failed: {error}")
                envelopes = []
            window = (self.max_staleness, self.max_rounds_ahead)
            for envelope in reading_order(envelopes, round, regulars, self.order_key, window, self.window.is_old):
                sender = self._accept(envelope, round, result, state, dropped)
                if sender is not None:
                    fresh.add(sender)
            moved, deferred = self.window.after_poll(round, result, state, dropped)  # sync: catch up (or back)
            self.round_offset += moved - round
            round = moved
            for envelope, digest, message in deferred:
                sender = self.take(envelope, digest, message, round, result, state, dropped)
                if sender is not None:
                    fresh.add(sender)
            if envelopes and time.monotonic() <= state.until and not self._interrupted.is_set():
                continue  # drain: a poll is bounded, what is left comes with the next one (unless told to stop)
            if not self.waits or self.window.satisfied(fresh) or self._interrupted.is_set():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                self.transport.wait(min(remaining, 1.0))
            except Exception as error:  # noqa: BLE001 - any transport failure: train on what arrived
                self.warn_once("transport", type(error).__name__, f"Waiting on the exchange failed: {error}")
                time.sleep(min(remaining, 0.5))
        result.waited = time.monotonic() - start
        result.round = round
        self._say_if_alone()
        result.bytes_read, result.messages_read = state.bytes, state.messages
        for kind, count in dropped.items():
            self.warn_once(
                "round_budget",
                kind,
                f"Round {round}: {count} message(s) dropped (round_budget): {BUDGET_TEXT[kind]}. Logged once per "
                "budget; `ftis/exchange/refused/round_budget` counts them every round.",
            )
        self.window.finish(round, result, state, fresh)
        return result

    def _say_if_alone(self) -> None:
        """After `LONELY_COLLECTS` collects that accepted nothing from anyone, say so once, naming the exchange: the
        others may be on another exchange (a different folder or Redis URL or `?swarm=`), or not started."""
        self._collects += 1
        if self._collects == LONELY_COLLECTS and not self.known_peers:
            logger.warning(
                "Peer %r has accepted no message from any other peer in %d rounds on the exchange %s: are the others "
                "using the same exchange_url (folder, Redis URL and ?swarm=) and started? "
                "(`ftis/exchange/refused/...` counts messages that arrived and were refused.)",
                self.peer_id,
                LONELY_COLLECTS,
                redact_url(self.url),
            )

    def forget(self, round: int) -> dict[bytes, int]:
        """Drop the digests of messages that fell out of the window ([`window`]): they are refused as stale anyway.
        Returns them (a catch-up keeps them, to [`remember`] if it is undone)."""
        kept = self.window.pruned(self._seen, round)
        dropped = {digest: accepted for digest, accepted in self._seen.items() if digest not in kept}
        self._seen = kept
        return dropped

    def remember(self, digests: Mapping[bytes, int]) -> None:
        """Take back digests [`forget`] dropped: the round went back to where they are in the window."""
        self._seen.update(digests)

    def _accept(self, envelope, round: int, result: RoundResult, state: RoundSpending, dropped: Counter) -> str | None:
        """Check and decode one envelope; add its rows to `result`. Returns the sender when accepted."""
        hint = envelope.sender_hint
        if envelope.error:
            result.refused[envelope.error] += 1
            self.warn_once(
                envelope.source, envelope.error, f"Skipped {envelope.source!r} from the exchange: {envelope.error}"
            )
            return None
        if hint == self.peer_id:
            return None  # our own message (or one written under our name: it can only get itself skipped)
        if self.window.refuses_unread(envelope, round, state, result):  # sync window: filed far beyond it
            return None
        spent = state.examine(hint, envelope.size or len(envelope.data))
        if spent is not None:
            result.refused["round_budget"] += 1
            dropped[spent] += 1
            return None
        digest = hashlib.blake2b(envelope.data, digest_size=16).digest()
        if digest in self._seen:  # the same bytes again: a retried publish, a directory read again after reopen
            result.refused["duplicate"] += 1
            return None
        try:
            message = decode_message(
                envelope.data,
                secret=self.secret,
                public_keys=self.public_keys,
                # Another tokenizer's ids are not ours: checked below, once the sender's tokenizer is known.
                vocab_limit=None if self.cross_tokenizer else self.vocab_limit,
                limits=self.limits,
                swarm=self.swarm_name,
                run=self.run_id,
            )
        except ExchangeError as error:
            result.refused[error.reason] += 1
            who = hint if hint is not None else envelope.source
            why = CREDENTIAL_HINT if error.reason in CREDENTIAL_REASONS else ""
            self.warn_once(str(who), error.reason, f"Refused a message sent as {who!r}: {error}{why}")
            return None
        sender = message.sender
        if sender == self.peer_id:
            return None
        if self.secret is None and self.public_keys is None and is_signed(envelope.data):
            self.warn_once(
                sender,
                "unchecked",
                f"Receiving signed messages from {sender!r} that this peer cannot check "
                "(it has no swarm_secret or peer_keys_file): give every peer the same credentials.",
            )
        if hint is not None and sender != hint:
            result.refused["sender_hint"] += 1
            self.warn_once(
                sender,
                "sender_hint",
                f"Refused a message from {sender!r} that the exchange names as coming from {hint!r}: peers publish "
                "under their own id only.",
            )
            return None
        problem = tokenizer_problem(
            message,
            fingerprint=self.fingerprint,
            tokenizer_name=self.tokenizer_name,
            vocab_limit=self.vocab_limit,
            cross_tokenizer=self.cross_tokenizer,
        )
        if problem is not None:
            reason, text = problem
            result.refused[reason] += 1
            self.warn_once(sender, reason, f"Refusing peer {sender!r}: {text}", level=logging.ERROR)
            return None
        if not math.isclose(message.temperature, self.temperature, rel_tol=1e-6):
            result.refused["temperature"] += 1
            self.warn_once(
                sender,
                "temperature",
                f"Refusing peer {sender!r}: it samples at temperature {message.temperature}, "
                f"we at {self.temperature}; all peers of a swarm must use one temperature.",
                level=logging.ERROR,
            )
            return None
        lead = epoch_lead(message.epoch)
        if lead is not None:  # a start signed in the future: recorded nowhere, it would outrank the sender's own
            result.refused["epoch"] += 1
            self.warn_once(
                sender,
                "epoch",
                f"Refused a message of {sender!r} whose start (epoch) is {lead:.0f} s ahead of this peer's clock, "
                f"more than the {EPOCH_LEAD_LIMIT:.0f} s allowed: its clock is far off, or the message is forged.",
            )
            return None
        if self.window.defer(envelope, digest, sender, message, round, state):  # sync: a live peer far ahead
            return None
        return self.take(envelope, digest, message, round, result, state, dropped)

    def take(self, envelope, digest: bytes, message: Message, round: int, result, state, dropped) -> str | None:
        """Accept a verified, decoded message of a compatible peer when its round is in the window and the round's
        budget allows; returns its sender when accepted."""
        sender, rows = message.sender, len(message.completions)
        outside = self.window.refusal(sender, message, round, state)
        if outside == "senders":  # as many senders followed as kept, and this one is not a regular
            result.refused["round_budget"] += 1
            dropped["senders"] += 1
            return None
        if outside is not None:
            stats = result.peers[sender]
            stats.rows_received += rows
            stats.rows_stale += rows
            result.refused[outside] += 1
            if outside == "ahead":
                self.warn_once(
                    sender,
                    "ahead",
                    f"{sender!r} is ahead of this peer (its round {message.round}, ours {round}; max_rounds_ahead="
                    f"{self.max_rounds_ahead}): its rows are not used until one catches up.",
                )
            return None
        spent, room = state.room(sender)
        kept = message if spent is not None or rows <= room else whole_groups(message, room)
        if spent is None:
            spent = state.take(sender, len(kept.completions), cut=kept is not message)
        if spent is not None:
            result.refused["round_budget"] += 1
            dropped[spent] += 1
            return None
        if kept is not message:  # beyond its sender's share of the round: cut, at that sender's cost alone
            result.peers[sender].rows_cut += rows - len(kept.completions)
            dropped["share"] += 1
            message = kept
        self.window.note(sender, message, result, state)
        self._seen[digest] = message.round
        stats = result.peers[sender]
        stats.bytes_received += envelope.size
        stats.rows_received += rows
        result.created[(sender, message.round)] = message.created
        if message.model and len(self.peer_models) < 1000:  # bounded like the warnings
            self.peer_models[sender] = message.model
        if biased_logps(message.sampling):
            self.warn_once(sender, "sampling", f"Rows from {sender!r}: {biased_logps(message.sampling)}.")
        if sender not in self.known_peers and len(self.known_peers) < MAX_KNOWN_PEERS:
            self.known_peers.add(sender)
            logger.info("Peer %r joined the swarm (round %d).", sender, message.round)
        lag = self.window.staleness(round, message)
        if lag is not None:
            stats.staleness.append(lag)
        result.rows.extend(
            message_to_rows(message, foreign_tokenizer=message.tokenizer_fingerprint != self.fingerprint)
        )
        if sender in self._delivered or len(self._delivered) < MAX_KNOWN_PEERS:
            self._delivered[sender] = max(self._delivered.get(sender, message.round), message.round)
        self._note_departure(sender, message, self.window.restarted(sender, message))
        return sender

    def _note_departure(self, sender: str, message: Message, restarted: bool = False) -> None:
        """A final message marks its sender departed; a later round from it (it restarted) brings it back. Only peers
        a round may wait for are recorded (all of them without `expected_peers`; the map is bounded either way)."""
        if self.expected_peers and sender not in self.expected_peers:
            return
        if message.final:
            if sender not in self.departed and len(self.departed) < MAX_KNOWN_PEERS:
                logger.info("Peer %r left the swarm (round %d): not waiting for it any more.", sender, message.round)
            if sender in self.departed or len(self.departed) < MAX_KNOWN_PEERS:
                self.departed[sender] = max(self.departed.get(sender, message.round), message.round)
        elif sender in self.departed and (restarted or message.round > self.departed[sender]):
            del self.departed[sender]
            logger.info("Peer %r is back (round %d): waiting for it again.", sender, message.round)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on as this one would, as JSON-serialisable values: the peers seen and their
        models, the expected peers not waited for, the digests of the messages accepted in the round window (read
        again after a restart, they are refused as duplicates instead of trained on twice), the round alignment
        (`round_offset`), the newest round each sender delivered, the window's own state (the sync window's: who is
        not waited for and each sender's newest round; the free window's: each sender's newest accepted epoch and
        round, so that nothing older is taken after a restart either), this peer's own [`epoch`] (a resumed start
        gets a newer one), the peers that left ([`departed`]) and the unpublished-row counts.
        Transport cursors are not part of it: a restarted peer reads what the exchange still holds."""
        return {
            "peer_id": self.peer_id,
            "known_peers": sorted(self.known_peers),
            "peer_models": dict(sorted(self.peer_models.items())),
            "seen": {digest.hex(): round for digest, round in self._seen.items()},
            "unpublished": dict(self.unpublished),
            "round_offset": self.round_offset,
            "delivered": dict(self._delivered),
            "window": {"name": self.window.name, "state": self.window.state_dict()},  # checked by the window itself
            "epoch": self.epoch,
            "departed": dict(self.departed),
            "run": self.run_id,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what [`state_dict`] returned. `ValueError` naming the field when `state` is not such a dict
        (nothing is changed then). Checkpoints are shared, so nothing in `state` is trusted: every map holds at most
        as many entries as this swarm ever keeps, every count and round is a whole number in [0, 2**63), `seen`
        holds at most the digests a round window can hold, and `round_offset` is at most the newest round a sender
        showed (the swarm only ever moves forward to such a round: [`SyncWindow.align`])."""
        checked = check_swarm_state(
            state,
            most_seen=self.window.most_seen,
            window_name=self.window.name,
            check_window=self.window.check_state,
            run_id=self.run_id,
            peer_id=self.peer_id,
        )
        self.known_peers = set(checked.known_peers)
        self.peer_models = dict(checked.peer_models)
        self._seen = checked.seen
        self.unpublished = Counter(checked.unpublished)
        self.round_offset = checked.round_offset
        self._delivered = dict(checked.delivered)
        if checked.window is not None:  # else the state of another kind of window: a fresh one
            self.window.load(checked.window)
        self.epoch = max(self.epoch, start_epoch(checked.epoch))  # every start newer, even if the clock went back
        self.departed = {
            peer: round
            for peer, round in checked.departed.items()
            if not self.expected_peers or peer in self.expected_peers
        }

    def warn_once(self, who: str, reason: str, text: str, level: int = logging.WARNING) -> None:
        """Log `text` once per (`who`, `reason`), for at most 1,000 pairs."""
        # Bounded: a flood of messages with made-up sender names must not grow memory (they are still counted).
        if (who, reason) not in self._warned and len(self._warned) < 1000:
            self._warned.add((who, reason))
            logger.log(level, text)

    @property
    def closed(self) -> bool:
        """Whether [`close`] was called (and [`reopen`] not since)."""
        return self._closed

    def close(self) -> None:
        """Close the transport (a Redis connection, open files). Idempotent: only the first call closes it."""
        if not self._closed:
            self._closed = True
            self.transport.close()

    def interrupt(self) -> None:
        """Make a round that waits for peers (in another thread: an async exchange worker) stop waiting within about a
        second and return what arrived; later rounds do not wait either, until [`reopen`]."""
        self._interrupted.set()

    def reopen(self) -> None:
        """Open a fresh transport on `url` after [`close`] (a trainer's second `train()`). Messages already
        accepted are refused as duplicates when read again, so nothing is trained on twice. Clears [`interrupt`]."""
        self._interrupted.clear()
        if self._closed:
            self.transport = self._open()
            self._closed = False
