"""A sync-mode peer that names no one to wait for says so when it starts: its rounds then take whatever has arrived
and wait for no one, so a slower peer's rows can miss their round (two peers started from the README's recipe without
`expected_peers` traded only part of their rows, silently)."""

from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace

import pytest
from tiny_trainers import tiny_trainer

from trl_ftis.swarm.rounds import no_waiting_warning

SAID = "waits for no one"


def config(**fields):
    settings = {"peer_id": "a", "exchange_mode": "sync", "expected_peers": None, "num_expected_peers": None}
    return SimpleNamespace(**{**settings, **fields})


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_lock_step_mode_without_expected_peers_is_warned_about_naming_the_options(mode):
    text = no_waiting_warning(config(exchange_mode=mode))
    assert text is not None and SAID in text and "whatever has arrived" in text
    assert "expected_peers" in text and "num_expected_peers" in text and repr(mode) in text


@pytest.mark.parametrize(
    "fields",
    [
        {"expected_peers": ["a", "b"]},
        {"num_expected_peers": 1},
        {"exchange_mode": "free"},  # the free mode never waits for anyone, by design
    ],
)
def test_nothing_to_say_when_rounds_wait_or_waiting_is_not_the_mode(fields):
    assert no_waiting_warning(config(**fields)) is None


def test_only_its_own_id_expected_is_no_one_to_wait_for():
    assert no_waiting_warning(config(expected_peers=["a"])) is not None


def said(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if SAID in record.getMessage()]


def test_a_trainer_on_an_exchange_says_it_once_when_it_starts(tokenizer, make_args, caplog):
    url = f"memory://no-wait-{uuid.uuid4().hex}"
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        tiny_trainer(tokenizer, make_args(exchange_url=url, peer_id="a", swarm_run=""))
    assert len(said(caplog)) == 1 and said(caplog)[0].startswith("Peer 'a': ")


def test_a_trainer_that_waits_or_trains_alone_says_nothing(tokenizer, make_args, caplog):
    url = f"memory://no-wait-{uuid.uuid4().hex}"
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        tiny_trainer(tokenizer, make_args(exchange_url=url, peer_id="a", swarm_run="", expected_peers=["a", "b"]))
        tiny_trainer(tokenizer, make_args())
    assert said(caplog) == []


def test_the_readmes_recipe_for_joining_a_swarm_names_whom_to_wait_for():
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    recipe = readme[readme.index("That trains exactly as before") :][:400]
    assert all(flag in recipe for flag in ("--exchange_url", "--peer_id", "--expected_peers", "--swarm_run")), recipe
