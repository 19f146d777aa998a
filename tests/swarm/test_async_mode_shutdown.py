"""`exchange_mode="async"`: `train()` ends promptly, whatever the peers do. A signal while the training loop waits
for the worker's round interrupts that round (not after `peer_timeout`), and a round whose result nobody will use
(the one in flight when training ends) skips the rest of its work: no tokenising or scoring of peers' texts after
the last step."""

import signal
import threading
import time
import uuid

import pytest
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path
from test_async_mode import async_trainer, worker_threads
from transformers import TrainerCallback
from waits import PROCESS_HANG_GUARD

from trl_ftis.swarm.exchange_modes import ExchangeWorker


@pytest.fixture
def url():
    return f"memory://async-shutdown-{uuid.uuid4().hex}"


def raise_keyboard_interrupt(signum, frame):  # what a peer's SIGTERM handler does
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_loop_waits_for_the_round_ends_train_at_once(
    tokenizer, make_args, url, monkeypatch, signum
):
    """Step 1 waits for round 0, which waits up to 60 s for a peer that never sends: the signal must end train()
    within a couple of seconds (the round in flight is interrupted), not when peer_timeout runs out."""
    waiting = threading.Event()
    take = ExchangeWorker.take

    def noted_take(self):
        if not self.idle():
            waiting.set()  # the training loop is about to block on the round in flight
        return take(self)

    monkeypatch.setattr(ExchangeWorker, "take", noted_take)
    # SIGINT: Python's own handler, set explicitly: a process started in the background by a non-interactive shell
    # (`make test &`) inherits SIGINT ignored, and Python then installs no handler of its own.
    handler = signal.default_int_handler if signum == signal.SIGINT else raise_keyboard_interrupt
    previous = signal.signal(signum, handler)
    main = threading.main_thread().ident
    sent = {}

    def send_signal():  # a signal to the main thread, as Ctrl-C or the launcher's SIGTERM would be
        if waiting.wait(30):
            time.sleep(0.3)  # well inside the blocking wait
            sent["at"] = time.monotonic()
            signal.pthread_kill(main, signum)

    # A round that ignored the signal would wait out peer_timeout: far past the hang guard below.
    trainer = async_trainer(tokenizer, make_args, url, expected_peers=["ghost"], peer_timeout=3600, max_steps=3)
    sender = threading.Thread(target=send_signal, daemon=True)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
        ended = time.monotonic()
    finally:
        signal.signal(signum, previous)
    sender.join(5)
    assert "at" in sent, "the training loop never waited for the round in flight"
    assert ended - sent["at"] < PROCESS_HANG_GUARD, f"train() ended {ended - sent['at']:.1f} s after the signal"
    assert not worker_threads()
    assert trainer.swarm.closed


class Slow:
    """A stand-in for heavy work on the rows of `round` (tokenising many large texts, slow reward functions):
    `seconds_per_row` for each, then `work` done for real; counts the rows of `round` it was given."""

    def __init__(self, work, round, seconds_per_row):
        self.work, self.round, self.seconds_per_row = work, round, seconds_per_row
        self.heavy_rows = 0

    def __call__(self, rows, **kwargs):
        heavy = sum(1 for row in rows if row.round == self.round)
        self.heavy_rows += heavy
        time.sleep(self.seconds_per_row * heavy)
        return self.work(rows, **kwargs)


class Publisher(TrainerCallback):
    """Other peers: `partner` sends 8 rows a step (round `r` at step `r`'s beginning); at step `heavy_round`, 256
    rows in one message instead, or, with `flood`, nothing, and `flood` (a sender nobody waits for) sends 128."""

    def __init__(self, partner, heavy_round, flood=None):
        self.partner, self.heavy_round, self.flood = partner, heavy_round, flood

    def on_step_begin(self, args, state, control, **kwargs):
        round = state.global_step
        if round != self.heavy_round:
            self.partner.publish(rows("partner", count=8, group=f"g{round}", round=round), round)
            return
        if self.flood is None:
            self.partner.publish([r for k in range(4) for r in rows("partner", 64, f"h{k}", round=round)], round)
            return
        for k in range(2):  # a newcomer's share of the round: half of its 256 rows
            self.flood.publish(rows("flood", 64, group=f"f{k}", round=round), round)


class EndOfLastStep(TrainerCallback):
    def __init__(self):
        self.at = None

    def on_step_end(self, args, state, control, **kwargs):
        self.at = time.monotonic()


def last_round_trainer(tokenizer, make_args, url, publisher: Publisher, last: int):
    """An async trainer of `last + 1` steps waiting for `partner` (peer_timeout an hour: a round left waiting would
    outlast any hang guard), and the callback that notes when its last step ended."""
    end = EndOfLastStep()
    trainer = async_trainer(
        tokenizer,
        make_args,
        url,
        callbacks=[publisher, end],
        expected_peers=["partner"],
        peer_timeout=3600,
        max_steps=last + 1,
    )
    return trainer, end


def train_to_the_end(trainer, end_of_last_step: EndOfLastStep) -> None:
    """Train; each step after the first trained on the partner's 8 rows, and train() ended without waiting for the
    round in flight. A hang guard, not a speed verdict: a round left waiting would run into peer_timeout (an hour)."""
    trainer.train()
    ended = time.monotonic()
    assert [entry["ftis/peer_rows"] for entry in trainer.state.log_history if "loss" in entry] == [0, 8, 8]
    assert ended - end_of_last_step.at < PROCESS_HANG_GUARD, (
        f"train() ended {ended - end_of_last_step.at:.0f} s after its last step"
    )


def test_a_heavy_last_round_still_collecting_at_the_end_is_not_admitted(tokenizer, make_args, url):
    """The last step's round is never trained on. Here the expected peer's last message never comes, so the worker
    still waits when training ends, while another sender's 128 rows are there that would cost ~4 s to admit: the
    interrupted round must skip its admission, and train() end without waiting for the missing message."""
    last = 2
    partner, flood = make_swarm(url, "partner", tokenizer), make_swarm(url, "flood", tokenizer)
    trainer, end = last_round_trainer(tokenizer, make_args, url, Publisher(partner, last, flood), last)
    admission = trainer._rounds.admission
    admission.admit = admit = Slow(admission.admit, last, seconds_per_row=0.03)
    train_to_the_end(trainer, end)
    assert admit.heavy_rows == 0  # never tokenised
    assert trainer.summary()["rows_received"] == 8 + 8 + 128  # still counted as received
    assert not worker_threads()
    assert trainer.swarm.closed


def test_a_last_round_admitting_at_the_end_is_not_rescored(tokenizer, make_args, url):
    """Here the last round's 256 rows arrived at once (128 of them taken: the partner's share of the round's rows,
    the newcomers' half being reserved): the worker is admitting them (~0.5 s) when training ends. The 64 selected
    would then be rescored by slow reward functions (~6 s): that is skipped, and train() ends within a couple of
    seconds of the last step (a hang guard here; the skipped rescoring is counted)."""
    last = 2
    publisher = Publisher(make_swarm(url, "partner", tokenizer), last)
    trainer, end = last_round_trainer(tokenizer, make_args, url, publisher, last)
    admission = trainer._rounds.admission
    admission.admit = admit = Slow(admission.admit, last, seconds_per_row=0.004)
    admission.rescore = rescore = Slow(admission.rescore, last, seconds_per_row=0.1)
    train_to_the_end(trainer, end)
    assert admit.heavy_rows == 128 and rescore.heavy_rows == 0
    assert not worker_threads()
    assert trainer.swarm.closed
