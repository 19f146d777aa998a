"""One rule, one verdict: the same inputs through the config, the launcher, the wire format and the transports.

Each rule lives in one module of its own (`trl_ftis.peer_ids`, `trl_ftis.redaction`, the transport registry, ...);
every part that applies it must agree, or a peer the config accepts would be refused by the wire (and silently never
publish), or a URL the transports open would be refused by the config.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trl_ftis import FTISConfig
from trl_ftis.exchange import ExchangeError, Message, WireCompletion, WireGroup, decode_message, encode_message
from trl_ftis.exchange.transports import MemoryTransport, open_transport, validate_sender
from trl_ftis.exchange.transports.redis_streams import redis_client_url
from trl_ftis.exchange.transports.registry import exchange_scheme
from trl_ftis.launcher import SwarmConfigError, load_swarm_config
from trl_ftis.launcher.commands import redact_argv
from trl_ftis.peer_ids import is_peer_id, peer_id_from
from trl_ftis.redaction import REDACTED, redact_url
from trl_ftis.sampling_bounds import MAX_LOGP
from trl_ftis.shared_names import SUMMARY_FILE, SWARM_SECRET_ENV

PEER_IDS = [
    # (peer id, valid)
    ("big", True),
    ("qwen2.5-1.5b", True),
    ("node_3.rank0", True),
    ("_private", True),
    ("A" * 64, True),
    ("A" * 65, False),
    ("", False),
    (".", False),
    ("..", False),
    (".hidden", False),
    ("x..y", False),
    ("-x", False),
    ("a b", False),
    ("a/b", False),
    ("a\\b", False),
    ("pëer", False),
    ("tab\there", False),
    ("colon:rank0", False),
]


def _config(**fields) -> FTISConfig:
    return FTISConfig(output_dir="unused", use_cpu=True, bf16=False, **fields)


def _config_verdict(peer_id: str) -> bool:
    try:
        _config(peer_id=peer_id, report_to=[])
    except ValueError:
        return False
    return True


def _expected_peers_verdict(peer_id: str) -> bool:
    try:
        _config(expected_peers=[peer_id], report_to=[])
    except ValueError:
        return False
    return True


def _launcher_verdict(peer_id: str, tmp_path) -> bool:
    raw = {"script": "train.py", "run_dir": str(tmp_path / "run"), "peers": [{"id": peer_id}, {"id": "zz-other"}]}
    try:
        load_swarm_config(raw)
    except SwarmConfigError as error:
        assert "`id`" in str(error), str(error)  # refused for the id, not for something else
        return False
    return True


def _message(sender: str) -> Message:
    return Message(
        sender=sender,
        round=0,
        tokenizer_fingerprint="0" * 64,
        tokenizer_name="tok",
        temperature=1.0,
        reward_names=["r"],
        groups=[WireGroup(prompt="1+1=")],
        completions=[
            WireCompletion(
                group=0,
                completion_ids=np.array([1, 2], dtype=np.int32),
                generator_logps=np.array([-0.5, -0.1], dtype=np.float32),
                reward=1.0,
                rewards_per_func=np.array([1.0], dtype=np.float32),
            )
        ],
    )


def _wire_send_verdict(peer_id: str) -> bool:
    try:
        encode_message(_message(peer_id))
    except ExchangeError as error:
        assert error.reason == "header"
        return False
    return True


def _wire_receive_verdict(peer_id: str) -> bool:
    # What a hostile sender would put on the wire: a valid message whose sender field is then swapped, byte for byte,
    # for `peer_id` (a placeholder id of the same JSON length keeps every length in the frame right).
    quoted = json.dumps(peer_id).encode()
    placeholder = "Z" * (len(quoted) - 2)
    data = encode_message(_message(placeholder))
    assert data.count(b'"' + placeholder.encode() + b'"') == 1
    data = data.replace(b'"' + placeholder.encode() + b'"', quoted)
    try:
        decode_message(data)
    except ExchangeError as error:
        assert error.reason == "header", error
        return False
    return True


def _transport_verdict(peer_id: str) -> bool:
    try:
        validate_sender(peer_id)
    except ValueError:
        refused = True
    else:
        refused = False
    transport = MemoryTransport(f"memory://rules-{abs(hash(peer_id))}")
    try:
        transport.publish(b"data", sender=peer_id, round=0)
    except ValueError:
        assert refused, f"validate_sender accepted {peer_id!r} but publish refused it"
        return False
    finally:
        transport.close()
    assert not refused, f"validate_sender refused {peer_id!r} but publish accepted it"
    return True


@pytest.mark.parametrize("peer_id, valid", PEER_IDS, ids=[repr(p) for p, _ in PEER_IDS])
def test_every_part_gives_the_same_verdict_on_a_peer_id(peer_id, valid, tmp_path):
    verdicts = {
        "rules": is_peer_id(peer_id),
        "FTISConfig.peer_id": _config_verdict(peer_id),
        "FTISConfig.expected_peers": _expected_peers_verdict(peer_id),
        "launcher": _launcher_verdict(peer_id, tmp_path),
        "wire (encode)": _wire_send_verdict(peer_id),
        "transports": _transport_verdict(peer_id),
    }
    assert verdicts == {name: valid for name in verdicts}


# Ids whose JSON form fits a valid placeholder (tests/exchange/test_wire.py covers the over-long ones on the wire).
@pytest.mark.parametrize("peer_id, valid", [(p, v) for p, v in PEER_IDS if 2 < len(json.dumps(p)) <= 66])
def test_the_wire_receiver_refuses_what_the_sender_may_not_send(peer_id, valid):
    assert _wire_receive_verdict(peer_id) == valid


EXCHANGE_URLS = [
    # (url, accepted by config and transports, accepted by the launcher)
    ("dir:///tmp/ftis-rules", True, True),
    ("DIR:///tmp/ftis-rules", True, True),
    ("Dir:///tmp/ftis-rules", True, True),
    ("memory://rules", True, False),  # in-process only: peers of a launched swarm are separate processes
    ("MEMORY://rules", True, False),
    ("redis://localhost:1/0", True, True),
    ("REDISS://localhost:1/0", True, True),
    ("http://localhost/x", False, False),
    ("file:///tmp/x", False, False),
    ("dir:/tmp/x", False, False),
    ("/tmp/x", False, False),
]


def _config_accepts(url: str) -> bool:
    try:
        config = _config(exchange_url=url, report_to=[])
    except ValueError:
        return False
    assert config.exchange_url.split("://", 1)[0] == exchange_scheme(url)  # normalised to lower case
    return True


def _transport_accepts(url: str, tmp_path) -> bool:
    if url.lower().startswith("dir://"):
        url = url[: len("dir://")] + str(tmp_path / "exchange")
    if url.lower().startswith(("redis", "rediss")):
        # Opening would connect; the scheme check runs first and is all this table is about.
        try:
            exchange_scheme(url)
        except ValueError:
            return False
        try:
            open_transport(url, connect_timeout=0.2)
        except ValueError:
            return False
        except Exception:  # no server on port 1: the scheme itself was accepted
            return True
        return True
    try:
        open_transport(url).close()
    except ValueError:
        return False
    return True


def _launcher_accepts(url: str, tmp_path) -> bool:
    raw = {"script": "train.py", "run_dir": str(tmp_path / "run"), "exchange_url": url, "peers": [{"id": "a"}]}
    try:
        load_swarm_config(raw)
    except SwarmConfigError as error:
        assert "exchange_url" in str(error), str(error)
        return False
    return True


@pytest.mark.parametrize("url, valid, launchable", EXCHANGE_URLS, ids=[u for u, _, _ in EXCHANGE_URLS])
def test_every_part_gives_the_same_verdict_on_an_exchange_url(url, valid, launchable, tmp_path):
    try:
        exchange_scheme(url)
        by_rules = True
    except ValueError:
        by_rules = False
    assert {"rules": by_rules, "config": _config_accepts(url), "transports": _transport_accepts(url, tmp_path)} == {
        "rules": valid,
        "config": valid,
        "transports": valid,
    }
    assert _launcher_accepts(url, tmp_path) == launchable


SECRET_URLS = [
    "redis://:hunter2@localhost:6379/0",
    "rediss://user:hunter2@cache.example:6380/1?swarm=a",
    "redis://localhost:6379/0?password=hunter2",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_every_part_redacts_a_url_password_the_same_way(url):
    shown = {
        "redact_url": redact_url(url),
        "launcher.redact_argv": " ".join(redact_argv(["--exchange_url", url])),
        "FTISConfig.to_dict": _config(exchange_url=url, report_to=[]).to_dict()["exchange_url"],
        "FTISConfig.__str__": str(_config(exchange_url=url, report_to=[])),
    }
    for where, text in shown.items():
        assert "hunter2" not in text, where
        assert REDACTED in text, where


def test_a_url_without_a_password_is_shown_unchanged_everywhere():
    for url in ("dir:///tmp/swarm", "redis://localhost:6379/0"):
        assert redact_url(url) == url
        assert redact_argv(["--exchange_url", url]) == ["--exchange_url", url]
        assert _config(exchange_url=url, report_to=[]).to_dict()["exchange_url"] == url


def test_the_generator_logp_bound_is_the_same_for_the_wire_and_the_trainer():
    from trl_ftis import PeerRow
    from trl_ftis.exchange import checks
    from trl_ftis.peer_rows import check_rows

    assert checks.MAX_LOGP is MAX_LOGP  # the wire format's checks live in exchange/checks.py
    just_inside, just_outside = MAX_LOGP, math.nextafter(MAX_LOGP, 1.0) * 2
    message = _message("a")
    message.completions[0].generator_logps = np.array([just_inside, -1.0], dtype=np.float32)
    encode_message(message)
    message.completions[0].generator_logps = np.array([just_outside, -1.0], dtype=np.float32)
    with pytest.raises(ExchangeError):
        encode_message(message)
    row = PeerRow(prompt="1+1=", completion_ids=[1, 2], generator_logps=[just_inside, -1.0], reward=1.0, group=0)
    check_rows([row], vocab_limit=10)
    row.generator_logps = [just_outside, -1.0]
    with pytest.raises(ValueError):
        check_rows([row], vocab_limit=10)


def test_shared_names_are_the_ones_each_part_uses():
    from trl_ftis import config, summary_file

    assert config.SWARM_SECRET_ENV == SWARM_SECRET_ENV == "FTIS_SWARM_SECRET"
    assert summary_file.SUMMARY_FILE == SUMMARY_FILE  # the summary callback writes the file the launcher reads


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Qwen/Qwen2.5-1.5B", "qwen2.5-1.5b"),
        ("/models/Qwen2.5-1.5B/", "qwen2.5-1.5b"),
        ("SmolLM2 135M", "smollm2-135m"),
        ("C:\\models\\Llama..3", "llama.3"),
        ("..", "peer"),
        ("", "peer"),
        ("x" * 100, "x" * 64),
    ],
)
def test_a_peer_id_is_made_from_a_model_name(name, expected):
    assert peer_id_from(name) == expected and is_peer_id(expected)


def test_the_redis_client_url_drops_only_trl_ftis_own_parameters():
    url = "rediss://:pw@host:6380/2?swarm=a&ssl_cert_reqs=none&connect_timeout=3"
    assert redis_client_url(url) == "rediss://:pw@host:6380/2?ssl_cert_reqs=none"
    assert redis_client_url("redis://host:6379/0") == "redis://host:6379/0"
