"""Hostile and mismatched peer rows (issue 10): every well-formed row is trained on as what it is, or dropped and
counted by reason; no number a peer sends can make the loss, a gradient or a parameter non-finite; names a peer
reports cannot break the model card.

Rows reach a trainer three ways here, each the way real rows do:

* a `memory://` swarm with a message published by another `Swarm` (the full wire path: what passes the wire's own
  checks and used to crash `train()`);
* the trainer's round with a stand-in swarm that hands over rows unpacked from a message (`message_to_rows`) without
  the wire's checks, so that the trainer's guards are tested on their own (the wire format bounds rewards and
  log-probs too; the trainer must not rely on it);
* `add_peer_rows`.
"""

from __future__ import annotations

import copy
import logging
import math
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from swarm_helpers import make_swarm  # tests/ is on sys.path
from waits import returns_within

from trl_ftis import FTISTrainer, PeerRow
from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama
from trl_ftis.peer_rows import MAX_ABS_ADVANTAGE
from trl_ftis.sampling_bounds import MAX_LOGP
from trl_ftis.swarm.peer_messages import message_to_rows, rows_to_message
from trl_ftis.swarm.round_budget import RoundResult
from trl_ftis.swarm.scoring import RESERVED_REWARD_COLUMNS
from trl_ftis.tasks.addition import addition_dataset, digit_match_reward

F32_MAX = float(np.finfo(np.float32).max)
DATASET = addition_dataset(64, seed=1)
KNOWN = DATASET[0]["prompt"]  # in every receiver's training set (its gold answer: DATASET[0]["answer"])
CHAT = [{"role": "user", "content": "12+34="}]
MAX_LEN = 6  # max_completion_length of the tiny config
VOCAB = len(build_char_tokenizer())
# Ids of the character tokenizer: 4 + digit for a digit, 2 for EOS. The default completion [8, 9, 2] reads "45".


# --------------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------------
def rows(sender, count=4, *, prompt="12+34=", extra=None, reward=1.0, group="g", ids=(8, 9, 2), logps=None, **kw):
    """`count` rows of one group; `reward` a number (row k gets `reward + k`) or a list (one per row)."""
    rewards = list(reward) if isinstance(reward, (list, tuple)) else [reward + k for k in range(count)]
    logps = [-0.5] * len(ids) if logps is None else list(logps)
    return [
        PeerRow(
            prompt=prompt,
            completion_ids=list(ids),
            generator_logps=logps,
            reward=value,
            group=group,
            sender=sender,
            rewards_per_func=kw.get("per_func", {"digit_match_reward": value}),
            extra={"answer": "46"} if extra is None else dict(extra),
            round=0,
        )
        for value in rewards
    ]


def unpacked(sender, sent):
    """Rows as a receiver gets them from a message (numpy arrays, `(sender, round, index)` groups), without the
    checks the wire format would run when encoding and decoding."""
    with np.errstate(over="ignore"):  # per-function rewards of 1e300 become inf in the message's float32 column
        message = rows_to_message(
            sent,
            sender=sender,
            round=0,
            tokenizer_fingerprint="f",
            tokenizer_name="char",
            temperature=1.0,
            reward_names=["digit_match_reward"],
        )
    return message_to_rows(message)


class StandInSwarm:
    """Stands in for `trl_ftis.swarm.client.Swarm` in the trainer's round: `collect` hands over the given rows once."""

    def __init__(self, received, peer_models=None):
        self.received = list(received)
        self.peer_models = dict(peer_models or {})
        self.known_peers = {row.sender for row in self.received}
        self.published = 0

    def publish(self, rows, round):
        self.published += len(rows)
        return 0

    def collect(self, round, *, max_rows=None, share=None):
        result = RoundResult()
        result.rows, self.received = self.received, []
        for row in result.rows:
            result.peers[row.sender].rows_received += 1
        return result

    def leave(self, round=None):
        self.left = True  # train() announces leaving before it closes
        return True

    def close(self):
        pass

    def reopen(self):
        pass


def make_trainer(tokenizer, make_args, *, url=None, swarm=False, reward_funcs=digit_match_reward, **overrides):
    """A tiny receiver: 8 own rows a step (one prompt), one step; in a swarm on `url` (or a fresh one) when `url` or
    `swarm` is given. Logged losses are not NaN-filtered (Trainer's default would log a NaN loss as 0)."""
    settings_ = {"max_steps": 1, "per_device_train_batch_size": 8, "logging_nan_inf_filter": False}
    if url is not None or swarm:
        settings_.update(exchange_url=url or f"memory://hostile-{uuid.uuid4().hex}", peer_id="me")
    settings_.update(overrides)
    return FTISTrainer(
        build_tiny_llama(tokenizer, hidden_size=32, seed=0),
        reward_funcs,
        args=make_args(**settings_),
        train_dataset=DATASET,
        processing_class=tokenizer,
    )


def with_stand_in(trainer, received, **kwargs):
    trainer.swarm = StandInSwarm(received, **kwargs)
    return trainer


def assert_finite_step(trainer):
    """Run `train()` (one step) and check the loss, the gradient norm and every parameter; return the logged entry."""
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert math.isfinite(entry["loss"]), entry["loss"]
    assert math.isfinite(entry["grad_norm"]), entry["grad_norm"]
    bad = [name for name, p in trainer.model.named_parameters() if not torch.isfinite(p).all()]
    assert not bad, f"non-finite parameters after the step: {bad}"
    return entry


def dropped(entry):
    return {key.removeprefix("ftis/peer_rows_dropped/"): v for key, v in entry.items() if "peer_rows_dropped/" in key}


# --------------------------------------------------------------------------------------------------------------------
# 1. Rows that passed the wire checks and crashed train()
# --------------------------------------------------------------------------------------------------------------------
def test_unknown_prompt_without_the_column_a_reward_function_needs(tokenizer, make_args):
    """Was: `TypeError: digit_match_reward() missing 1 required positional argument: 'answer'` (the keyword columns
    were the union of the rows' keys: no row had `answer`). Now the sender's group is dropped (`reward_error`) and
    another peer's rows are trained on."""
    url = f"memory://hostile-{uuid.uuid4().hex}"
    make_swarm(url, "odd", tokenizer).publish(rows("odd", prompt="99+99=", extra={}), 0)
    make_swarm(url, "fine", tokenizer).publish(rows("fine", prompt=KNOWN), 0)
    trainer = make_trainer(tokenizer, make_args, url=url)
    entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] == 4 and entry["ftis/peers/fine/rows_accepted"] == 4
    assert entry["ftis/peers/odd/rows_accepted"] == 0
    assert dropped(entry) == {"reward_error": 4} and entry["ftis/peer_rows_dropped"] == 4
    assert trainer.summary()["dropped"] == {"reward_error": 4}


def test_columns_named_like_reward_arguments_are_removed_not_passed(tokenizer, make_args):
    """Was: `TypeError: digit_match_reward() got multiple values for keyword argument 'prompts'` (and
    'completions'); `trainer_state`, `log_extra`, ... silently replaced what TRL passes. Now they are removed
    (`ftis/peer_rows_stripped/reserved_column`) and the rows scored with their other columns."""
    seen = []

    def recording_reward(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **columns):
        seen.append({"prompts": prompts, "completions": completions, "state": trainer_state, **columns})
        return digit_match_reward(completions, **columns)

    url = f"memory://hostile-{uuid.uuid4().hex}"
    hostile = {name: "x" for name in RESERVED_REWARD_COLUMNS} | {"answer": "45"}
    make_swarm(url, "p", tokenizer).publish(rows("p", prompt="99+99=", extra=hostile), 0)  # unknown: its columns
    trainer = make_trainer(tokenizer, make_args, url=url, reward_funcs=recording_reward)
    entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] == 4 and entry["ftis/peer_rows_dropped"] == 0
    assert entry["ftis/peer_rows_stripped/reserved_column"] == 4
    assert entry["ftis/peers/p/reward"] == 1.0  # "45" decodes from [8, 9, 2] and matches the sender's answer
    peer_call = seen[-1]
    assert set(peer_call) == {"prompts", "completions", "state", "answer"}
    assert peer_call["prompts"] == ["99+99="] * 4 and peer_call["completions"] == ["45"] * 4
    assert peer_call["state"] is trainer.state


@pytest.mark.parametrize("prompt", ["", []], ids=["empty-string", "empty-list"])
def test_empty_prompts_are_dropped(tokenizer, make_args, prompt):
    """Was: `[]` raised `IndexError` in TRL's `is_conversational`; `""` was trained on with a prompt of no tokens
    (its first completion token predicted from padding alone)."""
    url = f"memory://hostile-{uuid.uuid4().hex}"
    make_swarm(url, "p", tokenizer).publish(rows("p", prompt=prompt) + rows("p", group="h"), 0)
    entry = assert_finite_step(make_trainer(tokenizer, make_args, url=url))
    assert dropped(entry) == {"empty_prompt": 4} and entry["ftis/peer_rows"] == 4


BAD_CHAT_PROMPTS = {
    # was: ValueError "text input must be of type `str` ..." (no `role`: TRL took it for a plain prompt)
    "no-role": [{"content": "1+2="}],
    # was: KeyError 'content' in TRL's _tokenize_prompts
    "no-content": [{"role": "user"}],
    # were trained on as garbage: "Q:None", an assistant turn, ...
    "none-content": [{"role": "user", "content": None}],
    "none-role": [{"role": None, "content": "1+2="}],
    "unknown-role": [{"role": "wizard", "content": "1+2="}],
    "bad-second-message": [{"role": "user", "content": "1+2="}, {"role": "assistant"}],
}


@pytest.mark.parametrize("name", list(BAD_CHAT_PROMPTS))
def test_malformed_chat_prompts_are_dropped(tokenizer, make_args, name):
    url = f"memory://hostile-{uuid.uuid4().hex}"
    bad = rows("p", prompt=BAD_CHAT_PROMPTS[name])
    make_swarm(url, "p", tokenizer).publish(bad + rows("p", prompt=CHAT, group="ok"), 0)
    entry = assert_finite_step(make_trainer(tokenizer, make_args, url=url))
    assert dropped(entry) == {"bad_chat_prompt": 4} and entry["ftis/peer_rows"] == 4


def test_chat_prompts_without_a_chat_template_are_dropped(make_args):
    tokenizer = build_char_tokenizer(chat_template=None)
    trainer = with_stand_in(
        make_trainer(tokenizer, make_args, swarm=True),
        unpacked("p", rows("p", prompt=CHAT) + rows("p", group="plain")),
    )
    entry = assert_finite_step(trainer)
    assert dropped(entry) == {"no_chat_template": 4} and entry["ftis/peer_rows"] == 4


def test_a_chat_template_that_refuses_a_prompt_drops_only_that_prompt(make_args):
    """A real template may raise (`raise_exception`, e.g. roles that do not alternate): the prompt is dropped, the
    other prompts of the same batch are rendered (the failing call is split until the culprit is found)."""
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "Q:{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    tokenizer = build_char_tokenizer(chat_template=template)
    system = [{"role": "system", "content": "1"}, {"role": "user", "content": "1+2="}]
    received = [
        row for k in range(5) for row in rows("p", 2, prompt=[{"role": "user", "content": f"{k}+1="}], group=k)
    ]
    received[4:4] = rows("p", 2, prompt=system, group="sys")
    trainer = with_stand_in(make_trainer(tokenizer, make_args, swarm=True), unpacked("p", received))
    entry = assert_finite_step(trainer)
    assert dropped(entry) == {"bad_chat_prompt": 2} and entry["ftis/peer_rows"] == 10


@pytest.mark.parametrize("chat_first", [False, True], ids=["plain-first", "chat-first"])
def test_plain_and_chat_peers_are_each_rendered_and_scored_as_their_kind(tokenizer, make_args, chat_first):
    """Was: `TypeError: TextEncodeInput must be Union[...]` (plain first) or `TypeError: string indices must be
    integers` (chat first): the kind of the whole batch was taken from its first prompt. Each row is now rendered
    with its own kind (a chat prompt with the receiver's template) and its completion scored as its own kind."""
    calls = []

    def kind_checking_reward(prompts, completions, answer, **kwargs):
        for prompt, completion in zip(prompts, completions, strict=True):
            assert isinstance(prompt, list) == isinstance(completion, list), (prompt, completion)
        calls.append([isinstance(p, list) for p in prompts])
        return digit_match_reward(completions, answer)

    url = f"memory://hostile-{uuid.uuid4().hex}"
    chat_rows = rows("chatty", prompt=CHAT, ids=(8, 10, 2), reward=0.0)  # "46": the right answer
    plain_rows = rows("plain", ids=(8, 9, 2), reward=0.0)  # "45": half right
    for sender, sent in [("chatty", chat_rows), ("plain", plain_rows)][:: 1 if chat_first else -1]:
        make_swarm(url, sender, tokenizer).publish(sent, 0)
    trainer = make_trainer(tokenizer, make_args, url=url, reward_funcs=kind_checking_reward)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    assert batch["completion_ids"].shape[0] == 8 + 8
    sources = batch["ftis_source"][8:].tolist()
    peer_prompts = batch["prompt_ids"][8:]
    expected = {
        "chatty": tokenizer("Q:12+34=A:", add_special_tokens=False)["input_ids"],
        "plain": tokenizer("12+34=", add_special_tokens=False)["input_ids"],
    }
    for k, source in enumerate(sources):
        ids = expected[trainer._ledger.sources[source - 1]]
        assert peer_prompts[k, -len(ids) :].tolist() == ids
        assert batch["prompt_mask"][8 + k].sum() == len(ids)
    # Rescored with each row's own kind: the chat rows answer 46 (reward 1), the plain rows 45 (reward 0.5), not
    # the senders' rewards.
    metrics = trainer._metrics["train"]
    assert metrics["ftis/peers/chatty/reward"][-1] == 1.0 and metrics["ftis/peers/plain/reward"][-1] == 0.5
    assert sorted(map(tuple, calls[-2:])) == [(False,) * 4, (True,) * 4]
    with_stand_in(trainer, unpacked("chatty", chat_rows) + unpacked("plain", plain_rows))
    assert_finite_step(trainer)


def test_a_reward_function_that_raises_drops_that_senders_group_once_warned(tokenizer, make_args, caplog):
    """A reward function raising (or returning the wrong number of rewards) for a peer's rows drops those rows
    (`reward_error`), warned once per peer and reason, never the round and never another peer's rows."""

    def strict_reward(completions, answer, **kwargs):
        if any(value == "boom" for value in answer):
            raise RuntimeError("cannot parse answer 'boom'")
        if any(value == "short" for value in answer):
            return [0.0]
        return digit_match_reward(completions, answer)

    received = (
        unpacked("bad", rows("bad", prompt="99+98=", extra={"answer": "boom"}, group=1))
        + unpacked("bad", rows("bad", prompt="99+97=", extra={"answer": "boom"}, group=2))
        + unpacked("short", rows("short", prompt="99+96=", extra={"answer": "short"}))
        + unpacked("good", rows("good", prompt="99+99=", extra={"answer": "198"}))
    )
    trainer = with_stand_in(make_trainer(tokenizer, make_args, swarm=True, reward_funcs=strict_reward), received)
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] == 4 and entry["ftis/peers/good/rows_accepted"] == 4
    assert dropped(entry) == {"reward_error": 12}
    warnings = [r.getMessage() for r in caplog.records if "reward function raised" in r.getMessage()]
    assert len(warnings) == 2  # one for 'bad' (two messages), one for 'short'
    assert any("'bad'" in w and "cannot parse answer" in w for w in warnings)
    assert any("'short'" in w and "returned 1 rewards for 4" in w for w in warnings)


def test_every_rejection_in_one_round_is_counted_by_reason(tokenizer, make_args):
    """One round with one row set per reason: each is counted under its own metric, the total is their sum, and
    the reasons seen once keep being logged (0) in later steps."""
    received = []
    cases = {
        "too_long": rows("p", 2, ids=(8,) * (MAX_LEN + 1), group="long"),
        "empty_prompt": rows("p", 2, prompt="", group="empty"),
        "bad_chat_prompt": rows("p", 2, prompt=[{"role": "user"}], group="chat"),
        "reward_error": rows("p", 2, prompt="98+98=", extra={}, group="columns"),
        "unscorable": rows("p", 2, prompt="97+97=", extra={"answer": "none"}, group="none"),
        "nonfinite": rows("p", 2, prompt="96+96=", extra={"answer": "inf"}, group="inf"),
        "special_tokens": rows("p", 2, ids=(8, tokenizer.bos_token_id, 9), group="special"),
    }
    for sent in cases.values():
        received += unpacked("p", sent)
    received += unpacked("q", rows("q", prompt=KNOWN))

    def picky_reward(completions, answer, **kwargs):
        return [None if a == "none" else math.inf if a == "inf" else 0.5 for a in answer]

    trainer = with_stand_in(
        make_trainer(tokenizer, make_args, swarm=True, reward_funcs=picky_reward, max_steps=2), received
    )
    trainer.train()
    first, second = [e for e in trainer.state.log_history if "loss" in e]
    assert dropped(first) == {reason: 2 for reason in cases} and first["ftis/peer_rows_dropped"] == 14
    assert first["ftis/peer_rows"] == 4
    assert dropped(second) == {reason: 0 for reason in cases} and second["ftis/peer_rows_dropped"] == 0
    assert trainer.summary()["dropped"] == {reason: 2 for reason in cases}


def test_add_peer_rows_raises_for_programming_errors_and_drops_content(tokenizer, make_args, caplog):
    trainer = make_trainer(tokenizer, make_args)
    good = rows("api", 2)
    for bad, error in [
        ([object()], TypeError),
        ([PeerRow(prompt="1+1=", completion_ids=[8], generator_logps=[-1.0], reward=0.0, group=[1])], TypeError),
        (rows(7, 2), TypeError),  # sender not a string
        (rows("api", 2, prompt=None), TypeError),
        (rows("api", 2, ids=(8, VOCAB, 2)), ValueError),
        (rows("api", 2, logps=(-0.5, float("nan"), -0.5)), ValueError),
        (rows("api", 2, logps=(-0.5, 0.5, -0.5)), ValueError),
    ]:
        with pytest.raises(error):
            trainer.add_peer_rows(good + bad)
        assert trainer.num_pending_peer_rows == 0, "nothing is queued when a row is refused"
    bad_extra = rows("api", 2)
    for row in bad_extra:
        row.extra = {1: "x"}
    with pytest.raises(TypeError, match="extra"):
        trainer.add_peer_rows(bad_extra)

    content = (
        rows("api", 2, prompt="", group="e")
        + rows("api", 2, prompt=[{"role": "user"}], group="c")
        + rows("api", 2, ids=(8,) * (MAX_LEN + 1), group="l")
        + rows("api", 2, extra={"answer": "46", "prompts": "x"}, group="r")
        + rows("api", 2, prompt=CHAT, group="chat")
        + good
    )
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        assert trainer.add_peer_rows(content) == 6
    assert all("prompts" not in row.extra for row in trainer._inbox.rows)
    entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] == 6
    assert dropped(entry) == {"empty_prompt": 2, "bad_chat_prompt": 2, "too_long": 2}
    assert entry["ftis/peer_rows_stripped/reserved_column"] == 2
    assert sum("from 'api'" in r.getMessage() for r in caplog.records) == 4  # one per reason


# --------------------------------------------------------------------------------------------------------------------
# 2. Random well-formed rows through a real round and a real step
# --------------------------------------------------------------------------------------------------------------------
TEXT = st.text(alphabet="0123456789+=QA: xy|<", max_size=10)
MESSAGES = st.lists(  # any message a wire-valid prompt may hold: missing, null, unknown or empty fields
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "wizard", ""]), st.none()),
            "content": st.one_of(TEXT, st.none()),
        },
    ),
    max_size=3,
)
GOOD_MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT}),
    min_size=1,
    max_size=3,
)
PROMPTS = st.one_of(  # about half of them valid: known, unknown, plain, chat; then malformed and empty ones
    st.sampled_from([KNOWN, DATASET[1]["prompt"], "99+99="]),
    TEXT,
    GOOD_MESSAGES,
    MESSAGES,
    st.sampled_from(["", []]),
)
COLUMNS = st.builds(  # the gold answer often there (of any JSON type), sometimes missing; colliding names
    lambda answer, others: others | ({} if answer is None else {"answer": answer}),
    st.one_of(st.none(), TEXT, st.integers(-(10**6), 10**6)),
    st.dictionaries(
        st.sampled_from(["other", *sorted(RESERVED_REWARD_COLUMNS)]),
        st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), TEXT, st.floats(allow_nan=False)),
        max_size=3,
    ),
)
REWARDS = st.one_of(
    st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 1e-30, 1.0, F32_MAX, -F32_MAX, 1e300, -1e300]),
    st.floats(allow_nan=False, allow_infinity=False),
)
LOGPS = st.sampled_from([-0.0, MAX_LOGP, -1e-45, -1e-30, -0.5, -3.0, -100.0, -1e5, -1e30, -F32_MAX])


@st.composite
def groups(draw):
    """One prompt and its completions: random ids in the vocabulary, lengths 1 .. max_completion_length + 1."""
    prompt, extra = draw(PROMPTS), draw(COLUMNS)
    completions = []
    for _ in range(draw(st.integers(1, 5))):  # group sizes 1 .. 5
        length = draw(st.integers(1, MAX_LEN + 1))
        ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=length, max_size=length))
        logps = draw(st.lists(LOGPS, min_size=length, max_size=length))
        completions.append((ids, logps, draw(REWARDS)))
    return prompt, extra, completions


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    peers=st.lists(st.lists(groups(), min_size=2, max_size=3), min_size=1, max_size=2),
    trust=st.booleans(),
    scale_rewards=st.sampled_from(["group", "none"]),
    mode=st.sampled_from(["vertical", "horizontal"]),
    variant=st.sampled_from(["f-tis", "vis"]),
)
def test_random_well_formed_rows_never_crash_a_step_or_poison_the_model(
    tokenizer, make_args, peers, trust, scale_rewards, mode, variant
):
    received = []
    for p, peer_groups in enumerate(peers):
        sent = [
            PeerRow(
                prompt=prompt,
                completion_ids=ids,
                generator_logps=logps,
                reward=reward,
                group=g,
                sender=f"peer{p}",
                rewards_per_func={"digit_match_reward": reward},
                extra=extra,
                round=0,
            )
            for g, (prompt, extra, completions) in enumerate(peer_groups)
            for ids, logps, reward in completions
        ]
        received += unpacked(f"peer{p}", sent)
    trainer = make_trainer(
        tokenizer,
        make_args,
        swarm=True,
        trust_peer_rewards=trust,
        scale_rewards=scale_rewards,
        collaboration_mode=mode,
        variant=variant,
        max_peer_ratio=None,  # every row is either trained on or dropped: exact accounting below
    )
    with_stand_in(trainer, received)
    entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] + entry["ftis/peer_rows_dropped"] == len(received)
    assert "internal_error" not in dropped(entry)


# --------------------------------------------------------------------------------------------------------------------
# 3. Numbers cannot poison the model: extremes of every numeric field through a real step
# --------------------------------------------------------------------------------------------------------------------
def test_rewards_near_the_float32_maximum_no_longer_make_every_parameter_nan(tokenizer, make_args):
    """Was: with `trust_peer_rewards`, four rewards near 3.4e38 (finite, so accepted) overflowed the float32 group
    mean to inf; every advantage and, after one step, all 21 parameter tensors were NaN. The statistics are now
    float64 and scale-free: the advantages are those of rewards 1, 0.99, 0.98, 0.97."""
    rewards = [F32_MAX, 0.99 * F32_MAX, 0.98 * F32_MAX, 0.97 * F32_MAX]
    trainer = make_trainer(tokenizer, make_args, swarm=True, trust_peer_rewards=True)
    with_stand_in(trainer, unpacked("p", rows("p", reward=rewards, prompt=KNOWN)))
    trainer.model.train()
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    base = torch.tensor([1.0, 0.99, 0.98, 0.97], dtype=torch.float64)
    expected = ((base - base.mean()) / base.std()).float()
    torch.testing.assert_close(batch["advantages"][8:], expected, rtol=1e-3, atol=0)
    with_stand_in(trainer, unpacked("p", rows("p", reward=rewards, prompt=KNOWN)))
    entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] == 4


EXTREME_REWARD_GROUPS = {
    "pm-f32-max": [F32_MAX, -F32_MAX],
    "f32-max-spread": [F32_MAX, 0.5 * F32_MAX, -F32_MAX],
    "pm-1e300": [1e300, -1e300],
    "subnormal": [5e-324, 0.0, -5e-324],
    "tiny": [1e-30, 0.0],
    "identical": [F32_MAX, F32_MAX, F32_MAX],
    "zeros": [0.0, -0.0],
    "one-row-f32-max": [F32_MAX],
    "one-row-1e300": [-1e300],
}
TOO_LARGE_WITHOUT_SCALING = {"pm-f32-max", "f32-max-spread", "pm-1e300"}  # spreads far above MAX_ABS_ADVANTAGE


@pytest.mark.parametrize("path", ["add_peer_rows", "round"])
@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_extreme_rewards(tokenizer, make_args, path, scale_rewards):
    """Every kind of extreme reward group at once. Group-normalised, all are trained on with finite advantages; with
    `scale_rewards="none"` the groups whose reward spread exceeds `MAX_ABS_ADVANTAGE` are dropped
    (`advantage_too_large`), since `r - mean` is then the advantage itself."""
    sent = [row for name, r in EXTREME_REWARD_GROUPS.items() for row in rows("p", prompt=KNOWN, reward=r, group=name)]
    trainer = make_trainer(
        tokenizer, make_args, swarm=path == "round", trust_peer_rewards=True, scale_rewards=scale_rewards
    )
    if path == "round":
        received = unpacked("p", sent)
        for k, row in enumerate(received):  # and the round numbers a peer claims (the cap sorts by them)
            row.round = [None, -(10**30), 10**30, 0][k % 4]
        with_stand_in(trainer, received, peer_models={})
        trainer.args.max_peer_ratio = None
    else:
        trainer.add_peer_rows(sent)
    entry = assert_finite_step(trainer)
    too_large = sum(len(EXTREME_REWARD_GROUPS[name]) for name in TOO_LARGE_WITHOUT_SCALING)
    expected_dropped = too_large if scale_rewards == "none" else 0
    assert entry["ftis/peer_rows_dropped"] == expected_dropped
    assert entry["ftis/peer_rows"] == len(sent) - expected_dropped
    if expected_dropped:
        assert dropped(entry) == {"advantage_too_large": too_large}
    assert MAX_ABS_ADVANTAGE >= 2e6  # rewards within the wire's bound (|r| <= 1e6) are never dropped


def extreme_reward(completions, answer, **kwargs):
    """Our own second reward function, extreme on purpose for some peer columns (own rows score 0)."""
    table = {"max": F32_MAX, "-max": -F32_MAX, "huge": 1e300, "tiny": 5e-324, "inf": math.inf, "nan": math.nan}
    return [table.get(str(value)) if str(value) in table or value == "none" else 0.0 for value in answer]


@pytest.mark.parametrize("trust", [False, True])
def test_extreme_per_function_rewards(tokenizer, make_args, trust):
    """Per-function rewards at the extremes: sent by the peer (used as given with `trust_peer_rewards`, where they
    only travel with the row) and computed by our own reward functions when rescoring (a weighted float64 sum: an
    infinite total is dropped as `nonfinite`, an all-NaN/None row as `unscorable`)."""
    received = []
    for k, answer in enumerate(["max", "-max", "huge", "tiny", "inf", "nan", "none"]):
        per_func = {"extreme_reward": [F32_MAX, -F32_MAX, math.nan, math.inf][k % 4], "digit_match_reward": -F32_MAX}
        sent = rows("p", 3, prompt=f"9{k}+1=", extra={"answer": answer}, group=k, per_func=per_func)
        received += unpacked("p", sent)
    trainer = make_trainer(
        tokenizer,
        make_args,
        swarm=True,
        trust_peer_rewards=trust,
        reward_funcs=[extreme_reward, digit_match_reward],
        max_peer_ratio=None,
    )
    # rows_to_message keeps only this trainer's reward names; put the raw extremes back for the trusted path.
    for row in received:
        row.rewards_per_func = {"extreme_reward": F32_MAX, "digit_match_reward": -math.inf}
    with_stand_in(trainer, received)
    entry = assert_finite_step(trainer)
    if trust:
        assert entry["ftis/peer_rows"] == 21 and entry["ftis/peer_rows_dropped"] == 0
    else:  # "inf" makes the total infinite; "nan"/"none" leave digit_match_reward's value (nansum)
        assert dropped(entry) == {"nonfinite": 3} and entry["ftis/peer_rows"] == 18


EXTREME_LOGPS = {
    "-1e30": -1e30,
    "-f32-max": -F32_MAX,
    "-1e300": -1e300,  # finite in float64 (add_peer_rows accepts it), -inf in float32: floored at LOGP_FLOOR
    "-0.0": -0.0,
    "max-logp": MAX_LOGP,
    "-1e-45": -1e-45,
}


@pytest.mark.parametrize("variant", ["f-tis", "tis", "vis", "nois"])
def test_extreme_generator_log_probs(tokenizer, make_args, variant):
    sent = []
    for name, value in EXTREME_LOGPS.items():
        sent += rows("p", 2, prompt=KNOWN, reward=[1.0, 0.0], logps=[value, -0.5, value], group=name)
    sent += rows("p", 2, prompt=KNOWN, reward=[0.0, 1.0], logps=list(EXTREME_LOGPS.values())[:3], group="mixed")
    trainer = make_trainer(tokenizer, make_args, variant=variant)
    assert trainer.add_peer_rows(sent) == len(sent)
    entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] == len(sent)
    assert entry["ftis/peer/kl_nonfinite_frac"] == 0.0  # floored log-probs keep even the filter statistic finite


def test_extreme_completion_lengths_and_group_sizes(tokenizer, make_args):
    """Lengths 1, max_completion_length and longer (dropped); groups of 1, 2 and 1000 rows."""
    sent = rows("p", 2, prompt=KNOWN, ids=(8,), reward=[0.0, 1.0], group="len1")
    sent += rows("p", 2, prompt=KNOWN, ids=(8,) * MAX_LEN, reward=[0.0, 1.0], group="max")
    sent += rows("p", 2, prompt=KNOWN, ids=(8,) * (MAX_LEN + 1), group="longer")
    sent += rows("p", 2, prompt=KNOWN, ids=(8,) * 1000, group="much-longer")
    sent += rows("p", 1, prompt=KNOWN, reward=[F32_MAX], group="one")
    sent += rows("p", 1000, prompt=KNOWN, reward=[float(k % 7) for k in range(1000)], group="thousand")
    trainer = make_trainer(tokenizer, make_args, max_peer_ratio=None)  # no cap: the thousand rows in one step
    assert trainer.add_peer_rows(sent) == 2 + 2 + 1 + 1000
    entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] == 1005 and dropped(entry) == {"too_long": 4}


@pytest.mark.parametrize(
    "count, overrides, trained",
    [
        (0, {}, 0),
        (1, {}, 1),
        (7, {"gradient_accumulation_steps": 2, "per_device_train_batch_size": 4}, 6),  # one trimmed: batch_split
        (5, {"num_iterations": 2}, 5),
    ],
    ids=["none", "one", "odd-with-accumulation", "iterations"],
)
def test_row_counts(tokenizer, make_args, count, overrides, trained):
    trainer = make_trainer(tokenizer, make_args, **overrides)
    trainer.add_peer_rows(rows("p", count, prompt=KNOWN, reward=[F32_MAX * (-1) ** k for k in range(count)]))
    entry = assert_finite_step(trainer)
    assert entry["ftis/peer_rows"] == trained
    assert dropped(entry) == ({"batch_split": count - trained} if count > trained else {})


def test_horizontal_mode_keeps_own_advantages_finite_against_extreme_peer_rewards(tokenizer, make_args):
    """In horizontal mode a peer's rows share groups with our own: an enormous reward there would make our own rows'
    advantages enormous too (`scale_rewards="none"`). Those peer rows are dropped and our rows normalised alone."""
    trainer = make_trainer(
        tokenizer,
        make_args,
        swarm=True,
        collaboration_mode="horizontal",
        scale_rewards="none",
        trust_peer_rewards=True,
    )
    prompt = next(iter(trainer.get_train_dataloader()))[0]["prompt"]
    sent = rows("p", 2, prompt=prompt, reward=[F32_MAX, -F32_MAX], group="mixed")
    sent += rows("p", 2, prompt="99+99=", reward=[1.0, 0.0], group="alone")
    with_stand_in(trainer, unpacked("p", sent))
    trainer.model.train()
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    assert batch["advantages"].shape[0] == 8 + 2 and torch.isfinite(batch["advantages"]).all()
    assert batch["advantages"][:8].abs().max() <= 2.0  # own digit-match rewards only
    assert trainer._metrics["train"]["ftis/peer_rows_dropped/advantage_too_large"][-1] == 2


# --------------------------------------------------------------------------------------------------------------------
# 4. Peer-provided names in the model card
# --------------------------------------------------------------------------------------------------------------------
HOSTILE_NAMES = {
    "evil": "<script>alert(1)</script> | injected | cell",
    "ticks": "`code` [link](javascript:alert(1)) ![img](http://x/y.png) &amp; **bold**",
    "lines": "model\n## Injected heading\n| fake | row | here |\r\x00\x1b[31m",
    "long": "m" * 100_000,
}


def test_model_card_escapes_names_peers_report(tokenizer, make_args):
    received = [row for peer in HOSTILE_NAMES for row in unpacked(peer, rows(peer, 2, prompt=KNOWN))]
    trainer = make_trainer(tokenizer, make_args, swarm=True)
    with_stand_in(trainer, received, peer_models=HOSTILE_NAMES)
    trainer.add_peer_rows(rows("api|`<b>`\nsender", 2, prompt=KNOWN))  # a direct caller's sender is arbitrary text
    assert_finite_step(trainer)
    trainer.create_model_card(model_name="tiny")
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    section = card[card.index("## F-TIS training") : card.index("## Citations")]
    assert "<script>" not in section and "<b>" not in section and "<" not in section.replace("<redacted>", "")
    assert not any(line.lstrip().startswith(("## Injected", "| fake")) for line in section.splitlines())
    assert "\x00" not in section and "\x1b" not in section and "\r" not in section
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &#124; injected &#124; cell" in section
    table = section[section.index("| peer | model |") :].split("\n\n")[0].splitlines()
    assert "](" not in "\n".join(table) and "`code`" not in "\n".join(table)
    assert len(table) == 2 + 1 + len(HOSTILE_NAMES) + 1  # header, rule, this model, the peers, the API sender
    assert table[1] == "|---|---|---|"
    for line in [table[0], *table[2:]]:
        assert line.startswith("| ") and line.endswith(" |"), line
        assert len(line.split(" | ")) == 3, line  # three cells: no raw '|' inside one
        assert len(line) < 400, line  # names are cut
    cells = {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1] for line in table[2:]}
    assert cells["`long`"].endswith("…") and len(cells["`long`"]) == 120
    assert cells["`lines`"] == "model ## Injected heading &#124; fake &#124; row &#124; here &#124; &#91;31m"
    assert "api&#124;&#96;&lt;b&gt;&#96; sender" in cells


def test_model_card_of_a_lone_peer_escapes_its_own_model_name(tokenizer, make_args):
    trainer = make_trainer(tokenizer, make_args)
    trainer.model.config._name_or_path = "org/model | <img src=x onerror=alert(1)>\n# heading"
    trainer.create_model_card()
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    section = card[card.index("## F-TIS training") : card.index("## Citations")]  # TRL's own part is TRL's
    assert "<img" not in section and "\n# heading" not in section
    assert "org/model &#124; &lt;img src=x onerror=alert(1)&gt; # heading" in section


# --------------------------------------------------------------------------------------------------------------------
# Bookkeeping
# --------------------------------------------------------------------------------------------------------------------
def test_drop_warnings_are_bounded_and_once_per_peer_and_reason(tokenizer, make_args, caplog):
    trainer = make_trainer(tokenizer, make_args)
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        for _ in range(3):
            trainer.add_peer_rows(rows("a", 2, prompt="") + rows("b", 2, prompt=""))
    messages = [r.getMessage() for r in caplog.records if "empty prompt" in r.getMessage()]
    assert len(messages) == 2 and trainer._ledger.dropped["empty_prompt"] == 12
    for sender in range(2000):  # a flood of made-up sender names: counted, warned about at most 1000 times
        trainer._ledger.count(f"s{sender}", "too_long")
    assert trainer._ledger.num_warned <= 1000 and trainer._ledger.dropped["too_long"] == 2000


def test_special_and_added_tokens_inside_a_completion_are_dropped_at_both_levels(tokenizer, make_args):
    """Issue 23: a peer sharing the tokenizer sent `<|im_end|><|im_start|>` mid-completion, and SmolLM2's 14 added
    special tokens (`<file_sep>`, ...) are missing from `all_special_ids`, so they were trained on while the reward
    functions saw them stripped. Every special or added token is refused except a final end of sequence."""
    from tokenizers import AddedToken

    from trl_ftis.swarm.admission import control_token_ids

    added = copy.deepcopy(tokenizer)
    added.add_tokens([AddedToken("<file_sep>", special=True), AddedToken("<|im_start|>", special=True)])
    file_sep, im_start = added.convert_tokens_to_ids(["<file_sep>", "<|im_start|>"])
    assert file_sep not in added.all_special_ids  # as in SmolLM2: the old check missed them
    control = set(control_token_ids(added).tolist())
    assert {file_sep, im_start, added.pad_token_id, added.bos_token_id, added.eos_token_id} <= control

    trainer = make_trainer(added, make_args, swarm=True, cross_tokenizer=True)
    admission, eos = trainer._admission, added.eos_token_id
    assert not admission.holds_control_tokens([8, 9, eos])  # a final end of sequence is how completions end
    assert not admission.holds_control_tokens([8, 9, 10])  # cut at max length
    for ids in ([8, im_start, 9], [8, file_sep], [8, eos, 9], [added.pad_token_id, 8], [8, 9, file_sep]):
        assert admission.holds_control_tokens(ids), ids
    # Through the whole admission: token level (same tokenizer) and text level (another tokenizer's text).
    foreign = rows("f", 2, ids=(500, 501), group="text")  # another tokenizer's ids: its text is what counts
    for row, text in zip(foreign, ["12<file_sep>3", "12"], strict=True):
        row.foreign_tokenizer, row.completion_text, row.ends_with_eos = True, text, True
    sent = rows("p", 2, ids=(8, 9, eos)) + rows("p", 2, ids=(8, file_sep, 9), group="bad") + foreign
    kept = admission.admit(sent)
    assert len(kept) == 3 and trainer._ledger.dropped["special_tokens"] == 2
    assert trainer._ledger.dropped["text_special_tokens"] == 1  # the added token inside the text, re-tokenised


def test_oversize_prompts_and_texts_are_dropped_from_their_length_before_any_tokenisation(tokenizer, make_args):
    """Issue 23: one 16 MiB prompt added ~30 s and ~6 GB to a step (admission tokenised all of it before dropping
    it as too_long); 256 texts of 128 KiB cost ~22 s. Both are now bounded by what this receiver can use."""
    trainer = make_trainer(tokenizer, make_args, swarm=True, cross_tokenizer=True)
    admission = trainer._admission
    assert admission.max_prompt_chars < 2**20 and admission.max_text_chars < 2**12  # derived from its settings
    seen = []
    real = admission.tokenizer.__class__.__call__

    def spy(self, text, *args, **kwargs):
        seen.append(sum(map(len, text)) if isinstance(text, list) else len(text))
        return real(self, text, *args, **kwargs)

    huge_prompt = "12+34=" + "9" * (16 * 2**20)
    texts = rows("f", 256, ids=(500,), group="texts")
    for row in texts:
        row.foreign_tokenizer, row.completion_text, row.ends_with_eos = True, "4" * 2**17, True
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(admission.tokenizer.__class__, "__call__", spy)
        pool = rows("p", 2, prompt=huge_prompt, group="huge") + rows("q", 2) + texts
        kept = returns_within(lambda: admission.admit(pool), what="admitting huge texts")  # a hang guard only
    assert len(kept) == 2 and trainer._ledger.dropped["too_long"] == 2 + 256
    assert max(seen, default=0) < 2**16, "neither the prompt nor the texts reached the tokenizer"


def test_a_rounds_texts_are_tokenised_up_to_its_budget(tokenizer, make_args):
    trainer = make_trainer(tokenizer, make_args, swarm=True, cross_tokenizer=True)
    admission = trainer._admission
    each = admission.max_text_chars
    fit = admission.max_round_text_chars // each
    texts = rows("f", fit + 5, ids=(500,), group="texts")
    for row in texts:
        row.foreign_tokenizer, row.completion_text, row.ends_with_eos = True, "4" * each, False
    admission.admit(texts)
    assert trainer._ledger.dropped["text_budget"] == 5  # the rest were tokenised (and judged as usual)


def test_invented_sender_ids_cannot_grow_the_per_peer_metrics_without_bound(tokenizer, make_args):
    """Issue 23: 78,428 metric names in 300 steps from invented ids. The first MAX_NAMED_PEERS peers get their own
    `ftis/peers/<peer>/...`; the rest are counted together under OTHER_PEERS, in the round and loss metrics alike."""
    from trl_ftis.swarm.ledger import MAX_NAMED_PEERS, OTHER_PEERS

    senders = [f"x{k}" for k in range(MAX_NAMED_PEERS + 30)]
    received = [row for k, s in enumerate(senders) for row in unpacked(s, rows(s, 2, group=f"g{k}", prompt=KNOWN))]
    trainer = with_stand_in(make_trainer(tokenizer, make_args, swarm=True), received)
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    names = {key.split("/")[2] for key in entry if key.startswith("ftis/peers/")}
    assert OTHER_PEERS in names and len(names) == MAX_NAMED_PEERS + 1
    assert entry[f"ftis/peers/{OTHER_PEERS}/rows_received"] == 2 * 30  # counted, not lost
    assert len(trainer._ledger.sources) <= MAX_NAMED_PEERS + 1  # the rows a step took, from at most that many
    # The loss's per-source sums (one all-reduced row per source) are bounded the same way.
    ledger = trainer._ledger
    ledger.add_sources(f"y{k}" for k in range(200))
    assert len(ledger.sources) == MAX_NAMED_PEERS + 1 and ledger.sources[-1] == OTHER_PEERS
    assert ledger.source_index("y199") == ledger.source_index("y150") == len(ledger.sources)
