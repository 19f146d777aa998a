"""Swarm rounds in one process over the memory transport: who is refused, waiting, selection, rescoring."""

import logging
import time
import uuid
from pathlib import Path

import pytest
from swarm_helpers import make_swarm, rows
from waits import returns_within

from trl_ftis import PeerRow
from trl_ftis.demo.tiny import build_tiny_llama
from trl_ftis.exchange.transports import open_transport
from trl_ftis.peer_rows import assign_group_statistics, select_rows
from trl_ftis.swarm.peer_messages import message_to_rows, rows_to_message
from trl_ftis.tasks.addition import addition_dataset, digit_match_reward


@pytest.fixture
def url():
    return f"memory://swarm-{uuid.uuid4().hex}"


def test_rows_survive_the_wire(tokenizer):
    original = rows("a") + rows("a", group="h", prompt=[{"role": "user", "content": "1+2="}])
    message = rows_to_message(
        original,
        sender="a",
        round=3,
        tokenizer_fingerprint="f",
        tokenizer_name="t",
        temperature=1.0,
        reward_names=["digit_match_reward"],
    )
    assert len(message.groups) == 2  # one prompt entry per group, not per row
    back = message_to_rows(message)
    for before, after in zip(original, back, strict=True):
        assert after.prompt == before.prompt and list(after.completion_ids) == before.completion_ids
        assert after.generator_logps == pytest.approx(before.generator_logps)
        assert after.reward == before.reward and after.extra == before.extra
        assert after.sender == "a" and after.round == 3
        assert after.rewards_per_func == before.rewards_per_func
    assert len({row.group for row in back}) == 2


def test_peers_see_each_other_but_not_themselves(tokenizer, url):
    a, b = make_swarm(url, "a", tokenizer), make_swarm(url, "b", tokenizer)
    assert a.publish(rows("a"), round=0) > 0
    b.publish(rows("b", count=2), round=0)
    got_a, got_b = a.collect(0), b.collect(0)
    assert [r.sender for r in got_a.rows] == ["b", "b"]
    assert [r.sender for r in got_b.rows] == ["a"] * 4
    assert got_a.peers["b"].rows_received == 2 and got_a.peers["b"].bytes_received > 0
    assert a.collect(1).rows == []  # each message is used once


def test_strangers_bad_signatures_and_garbage_are_refused_and_counted(tokenizer, url, caplog):
    secret = "swarm-secret"
    a = make_swarm(url, "a", tokenizer, secret=secret)
    friend = make_swarm(url, "friend", tokenizer, secret=secret)
    stranger = make_swarm(url, "stranger", tokenizer)  # no secret: unsigned messages
    impostor = make_swarm(url, "impostor", tokenizer, secret="wrong")
    friend.publish(rows("friend"), 0)
    stranger.publish(rows("stranger"), 0)
    impostor.publish(rows("impostor"), 0)
    open_transport(url).publish(b"\x00garbage" * 10, sender="noise", round=0)
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        result = a.collect(0)
    assert {r.sender for r in result.rows} == {"friend"}
    assert result.refused["unsigned"] == 1 and result.refused["signature"] == 1
    assert sum(result.refused.values()) == 3  # + the garbage, under its decoding reason
    assert "stranger" in caplog.text and "impostor" in caplog.text


def test_a_different_tokenizer_is_refused_with_both_names_logged_once(tokenizer, url, caplog):
    a = make_swarm(url, "a", tokenizer)
    other = make_swarm(url, "other", tokenizer, tokenizer_fingerprint="0" * 64, tokenizer_name="gpt2")
    with caplog.at_level(logging.ERROR, logger="trl_ftis"):
        other.publish(rows("other"), 0)
        first = a.collect(0)
        other.publish(rows("other"), 1)
        second = a.collect(1)
    assert first.rows == [] and second.rows == []
    assert first.refused["tokenizer"] == 1 and second.refused["tokenizer"] == 1
    errors = [r for r in caplog.records if "tokenizer" in r.getMessage()]
    assert len(errors) == 1 and "gpt2" in errors[0].getMessage() and "'char'" in errors[0].getMessage()


def test_another_temperature_and_out_of_vocabulary_ids_are_refused(tokenizer, url):
    a = make_swarm(url, "a", tokenizer)
    make_swarm(url, "hot", tokenizer, temperature=0.7).publish(rows("hot"), 0)
    bad_ids = rows("big-vocab")
    bad_ids[0].completion_ids = [8, 5000, 2]
    make_swarm(url, "big-vocab", tokenizer).publish(bad_ids, 0)
    result = a.collect(0)
    assert result.rows == []
    assert result.refused["temperature"] == 1 and result.refused["ids"] == 1


def test_stale_rounds_are_dropped(tokenizer, url):
    a = make_swarm(url, "a", tokenizer, max_staleness=1)
    b = make_swarm(url, "b", tokenizer, keep_rounds=100)  # the sender keeps its old messages in the exchange
    for round in (0, 3, 4, 6):
        b.publish(rows("b", round=round), round)
    result = a.collect(4)
    assert sorted({r.round for r in result.rows}) == [3, 4, 6]  # 4 - 0 > 1: stale; a peer ahead is welcome
    assert result.refused["stale"] == 1 and result.peers["b"].rows_stale == 4


def test_a_round_waits_for_expected_peers_and_a_dead_peer_costs_one_timeout(tokenizer, url):
    a = make_swarm(url, "a", tokenizer, expected_peers=["b", "dead"], peer_timeout=1.0)
    b = make_swarm(url, "b", tokenizer)
    b.publish(rows("b"), 0)
    started = time.monotonic()
    first = returns_within(lambda: a.collect(0), what="a round with a dead peer")
    assert time.monotonic() - started >= 0.9  # the dead peer was waited for, up to its timeout (a lower bound)
    assert first.missing == ["dead"] and len(first.rows) == 4
    a.peer_timeout = 600.0  # waiting for the dead peer again would cost this, far past the hang guard
    b.publish(rows("b"), 1)
    second = returns_within(lambda: a.collect(1), what="a round after a peer missed its deadline (not waited for)")
    assert second.missing == [] and len(second.rows) == 4


def test_a_peer_a_round_ahead_is_not_waited_for_what_it_already_delivered(tokenizer, url):
    """b publishes rounds 0 and 1 before a collects round 0 (a faster peer, within max_rounds_ahead): a takes both
    then, and in round 1 does not wait for something new from b (seen in a real swarm: a 120 s timeout)."""
    # waiting for b in round 1 would cost the whole timeout, far past the hang guard
    a = make_swarm(url, "a", tokenizer, expected_peers=["b"], peer_timeout=600.0)
    b = make_swarm(url, "b", tokenizer)
    b.publish(rows("b"), 0)
    b.publish(rows("b"), 1)
    first = a.collect(0)
    assert len(first.rows) == 8 and first.missing == []
    second = returns_within(lambda: a.collect(1), what="round 1, whose rows b delivered already")
    assert second.missing == [] and second.rows == []
    b.publish(rows("b"), 2)  # and in round 2 it is waited for again, and delivers
    third = a.collect(2)
    assert len(third.rows) == 4 and third.missing == []


def test_num_expected_peers_waits_for_the_count(tokenizer, url):
    import threading

    # stopping at the count, not at the timeout: waiting the whole timeout would run far past the hang guard
    a = make_swarm(url, "a", tokenizer, num_expected_peers=2, peer_timeout=600.0)
    make_swarm(url, "b", tokenizer).publish(rows("b"), 0)
    late = make_swarm(url, "c", tokenizer)
    threading.Timer(0.3, lambda: late.publish(rows("c"), 0)).start()
    result = returns_within(lambda: a.collect(0), what="a round waiting for two peers, the second one late")
    assert {r.sender for r in result.rows} == {"b", "c"} and result.missing == []  # it waited for the late one


def test_select_rows_takes_whole_groups_fairly_newest_first():
    pool = rows("fast", group="old", round=1) + rows("fast", group="new", round=2) + rows("slow", group="x", round=2)
    chosen = select_rows(pool, 8)
    assert len(chosen) == 8
    assert {(r.sender, r.group) for r in chosen} == {("fast", "new"), ("slow", "x")}
    assert select_rows(pool, None) == pool
    assert len(select_rows(pool, 5)) == 4  # whole groups only


def test_assign_group_statistics_normalises_before_sharing_out():
    pool = rows("a", count=2, reward=0.0) + rows("b", count=3, reward=10.0)
    pool[-1].completion_ids = [8, 9, 9, 9, 2]
    pool[-1].generator_logps = [-0.1] * 5
    assign_group_statistics(pool)
    assert [r.group_max_length for r in pool] == [3, 3, 5, 5, 5]
    assert pool[0].advantage < 0 < pool[1].advantage
    assert pool[3].advantage == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------------------------------------------------
# A trainer in the swarm (in-process peers publish directly on the memory transport)
# --------------------------------------------------------------------------------------------------------------------
def swarm_trainer(tokenizer, make_args, url, **overrides):
    from trl_ftis import FTISTrainer

    args = make_args(exchange_url=url, peer_id="me", max_steps=1, **overrides)
    return FTISTrainer(
        build_tiny_llama(tokenizer, seed=0),
        digit_match_reward,
        args=args,
        train_dataset=addition_dataset(64, seed=1),
        processing_class=tokenizer,
    )


def logged(trainer):
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    return entry


@pytest.mark.parametrize("trust", [False, True])
def test_peer_rewards_are_recomputed_unless_trusted(tokenizer, make_args, url, trust):
    liar = make_swarm(url, "liar", tokenizer)
    lies = rows("liar", count=8, reward=1000.0)  # "8, 9" decodes to "89": digit_match gives 0 for answer "46"
    liar.publish(lies, 0)
    trainer = swarm_trainer(tokenizer, make_args, url, trust_peer_rewards=trust)
    trainer.train()
    entry = logged(trainer)
    assert entry["ftis/peers/liar/rows_accepted"] == 8 and entry["ftis/peer_rows"] == 8
    text = tokenizer.decode(lies[0].completion_ids, skip_special_tokens=True)
    expected = sum(1000.0 + k for k in range(8)) / 8 if trust else digit_match_reward([text], ["46"])[0]
    assert entry["ftis/peers/liar/reward"] == pytest.approx(expected)
    summary = trainer.summary()
    assert summary["rows_received"] == 8 and summary["rows_sent"] == 16 and summary["peers"] == ["liar"]


def test_own_rows_are_published_with_generator_logps(tokenizer, make_args, url):
    listener = make_swarm(url, "observer", tokenizer)
    trainer = swarm_trainer(tokenizer, make_args, url)
    trainer.train()
    received = listener.collect(0).rows
    assert len(received) == 16 and {r.sender for r in received} == {"me"}
    assert all(len(r.generator_logps) == len(r.completion_ids) for r in received)
    assert all(max(r.generator_logps) <= 0 for r in received)


def test_peer_row_cap_bounds_the_batch(tokenizer, make_args, url):
    peer = make_swarm(url, "many", tokenizer)
    peer.publish([row for g in range(6) for row in rows("many", group=g, count=8)], 0)
    trainer = swarm_trainer(tokenizer, make_args, url, max_peer_ratio=1.0)  # 16 local rows: at most 16 peer rows
    trainer.train()
    entry = logged(trainer)
    assert entry["ftis/peer_rows_received"] == 48 and entry["ftis/peer_rows_accepted"] == 16


def test_horizontal_mode_normalises_mixed_groups(tokenizer, make_args, url):
    from trl_ftis import FTISTrainer

    trainer = swarm_trainer(tokenizer, make_args, url, collaboration_mode="horizontal")
    # The peer answers the same prompts the trainer will draw (same dataset, same seed), perfectly.
    first = next(iter(trainer.get_train_dataloader()))
    prompts = {example["prompt"]: example["answer"] for example in first}
    peer_rows = []
    for k, (prompt, answer) in enumerate(prompts.items()):
        ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        peer_rows += [
            PeerRow(
                prompt=prompt,
                completion_ids=ids,
                generator_logps=[-0.1] * len(ids),
                reward=1.0,
                group=k,
                sender="oracle",
                extra={"answer": answer},
                round=0,
            )
            for _ in range(4)
        ]
    make_swarm(url, "oracle", tokenizer).publish(peer_rows, 0)
    trainer = swarm_trainer(tokenizer, make_args, url, collaboration_mode="horizontal")
    assert isinstance(trainer, FTISTrainer)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    own, peer = batch["advantages"][:16], batch["advantages"][16:]
    # The oracle's perfect answers are the best of every mixed group (in vertical mode, a group of equal rewards,
    # they would all get advantage 0).
    assert len(peer) == 8 and (peer > 0).all() and own.max() < peer.min()


def test_a_message_delivered_twice_is_used_once(tokenizer, url):
    a, b = make_swarm(url, "a", tokenizer), make_swarm(url, "b", tokenizer)
    sent = []
    publish = b.transport.publish
    b.transport.publish = lambda data, **where: (sent.append((data, where)), publish(data, **where))
    b.publish(rows("b"), 0)
    (data, where), *_ = sent
    publish(data, **where)  # a retried publish: the same bytes again (e.g. Redis, after a dropped connection)
    result = a.collect(0)
    assert len(result.rows) == 4 and result.refused["duplicate"] == 1
    a.close()
    a.reopen()  # a second train(): the exchange is read again from its start
    again = a.collect(0)
    assert again.rows == [] and again.refused["duplicate"] == 2


def test_peers_report_their_models_and_the_model_card_names_the_swarm(tokenizer, make_args, url):
    peer = make_swarm(url, "coder", tokenizer, model_name="Qwen/Qwen2.5-Coder-1.5B")
    silent = make_swarm(url, "quiet", tokenizer)  # an older peer that sends no model name
    peer.publish(rows("coder", count=8), 0)
    silent.publish(rows("quiet", count=8, group="q"), 0)
    trainer = swarm_trainer(tokenizer, make_args, url, variant="f-tis", is_cap=3.0, kl_threshold=25.0)
    trainer.train()
    assert trainer.swarm.peer_models == {"coder": "Qwen/Qwen2.5-Coder-1.5B"}
    assert trainer.summary()["peer_models"] == {"coder": "Qwen/Qwen2.5-Coder-1.5B"}
    # The trainer sends its own model's name: the observer sees it.
    observer = make_swarm(url, "observer", tokenizer)
    observer.collect(0)
    assert observer.peer_models["me"] == trainer._model_name()

    trainer.create_model_card(model_name="tiny-ftis")
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    section = card[card.index("## F-TIS training") : card.index("## Citations")]
    assert "| variant | `f-tis` |" in section
    assert (
        "| truncation cap C (`is_cap`) | 3 |" in section and "| filter threshold g (`kl_threshold`) | 25 |" in section
    )
    assert "| `me` (this model) |" in section
    assert "| `coder` | Qwen/Qwen2.5-Coder-1.5B | 8 |" in section
    assert "| `quiet` | not reported | 8 |" in section
    assert "2605.22537" in section and "F-TIS: Harnessing Diverse Models" in section


def test_a_lone_trainer_card_says_it_trained_alone(tokenizer, make_args, url):
    trainer = swarm_trainer(tokenizer, make_args, url)
    trainer.train()
    trainer.create_model_card()
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    assert "trained on its own completions only" in card and "| variant | `f-tis` |" in card


def test_rescoring_uses_our_gold_answer_not_the_senders(tokenizer, make_args, url):
    """A peer sends completions with a forged gold answer that matches them: the prompt is in our training set, so
    the reward function reads our answer column for it and the forgery earns nothing extra."""
    dataset = addition_dataset(64, seed=1)
    example = dataset[0]
    forged = rows("forger", count=8, prompt=example["prompt"])
    text = tokenizer.decode(forged[0].completion_ids, skip_special_tokens=True)
    for row in forged:
        row.extra = {"answer": text}
    unknown = rows("forger", count=8, group="u", prompt="99+99=")  # not in our data: its own columns are used
    make_swarm(url, "forger", tokenizer).publish(forged + unknown, 0)
    trainer = swarm_trainer(tokenizer, make_args, url)
    trainer.train()
    entry = logged(trainer)
    ours = digit_match_reward([text], [example["answer"]])[0]
    theirs = digit_match_reward([text], ["46"])[0]  # the unknown prompt's own column
    assert digit_match_reward([text], [text])[0] == 1.0 and ours < 1.0
    assert entry["ftis/peers/forger/reward"] == pytest.approx((ours * 8 + theirs * 8) / 16)


@pytest.fixture
def closed_transports(monkeypatch):
    """A spy on the memory transport: every call to `close`, by transport, in order."""
    from trl_ftis.exchange.transports import MemoryTransport

    calls = []
    close = MemoryTransport.close

    def spy(self):
        calls.append(self)
        close(self)

    monkeypatch.setattr(MemoryTransport, "close", spy)
    return calls


def test_swarm_close_is_idempotent_and_reopen_reconnects(tokenizer, url, closed_transports):
    swarm, sender = make_swarm(url, "a", tokenizer), make_swarm(url, "b", tokenizer)
    first = swarm.transport
    swarm.close()
    swarm.close()
    assert closed_transports == [first] and swarm.closed
    swarm.reopen()
    assert not swarm.closed and swarm.transport is not first
    sender.publish(rows("b"), 0)
    assert len(swarm.collect(0).rows) == 4


def test_train_closes_the_swarm_once_when_it_ends(tokenizer, make_args, url, closed_transports):
    trainer = swarm_trainer(tokenizer, make_args, url)
    first = trainer.swarm.transport
    trainer.train()
    assert closed_transports == [first] and trainer.swarm.closed
    trainer.swarm.close()
    assert closed_transports == [first]
    assert trainer.summary()["rows_sent"] == 16  # what a finished run reports is still there
    # A second train() reconnects, publishes again, and closes its new transport in turn.
    trainer.train()
    second = trainer.swarm.transport
    assert second is not first and closed_transports == [first, second]
    assert trainer.summary()["rows_sent"] == 32


def test_train_closes_the_swarm_when_a_training_step_raises(tokenizer, make_args, url, closed_transports, monkeypatch):
    trainer = swarm_trainer(tokenizer, make_args, url)

    def fail(*args, **kwargs):
        raise RuntimeError("boom inside a training step")

    monkeypatch.setattr(trainer, "_compute_loss", fail)
    with pytest.raises(RuntimeError, match="boom inside a training step"):
        trainer.train()
    assert closed_transports == [trainer.swarm.transport] and trainer.swarm.closed


def test_require_known_prompts_drops_rows_for_prompts_we_do_not_have(tokenizer, make_args, url):
    dataset = addition_dataset(64, seed=1)
    known = rows("p", count=8, prompt=dataset[0]["prompt"])
    unknown = rows("p", count=8, group="u", prompt="99+99=")
    make_swarm(url, "p", tokenizer).publish(known + unknown, 0)
    trainer = swarm_trainer(tokenizer, make_args, url, require_known_prompts=True)
    trainer.train()
    assert logged(trainer)["ftis/peer_rows"] == 8
    assert trainer.summary()["refused"]["unknown_prompt"] == 8
