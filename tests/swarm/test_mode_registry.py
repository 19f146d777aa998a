"""Exchange modes are strategies: one object each behind the `ExchangeMode` protocol, chosen from the core's registry
(which the config reads without importing the swarm), never branches on the mode's name in the swarm client, the
round runner or the config; a new mode is one class and one registration (the worked example of docs/swarm.md,
"Writing an exchange mode"; a mode with its own window and state: test_mode_plugin.py)."""

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from swarm_helpers import make_swarm, registered_mode, rows  # tests/ is on sys.path
from tiny_trainers import exchange_trainer

import trl_ftis
from trl_ftis import FTISConfig
from trl_ftis.exchange_mode_registry import EXCHANGE_MODE_NAMES, EXCHANGE_MODES, exchange_mode, register_exchange_mode
from trl_ftis.swarm.exchange_modes import AsyncMode, FreeMode, RoundOutcome, SyncMode
from trl_ftis.swarm.exchange_modes.free_window import FreeWindow
from trl_ftis.swarm.exchange_modes.sync_window import SyncWindow

PACKAGE = Path(trl_ftis.__file__).parent
MODE_BRANCH = re.compile(
    r"free_running|exchange_mode\s*[!=]=|exchange_mode\s+in\s|[!=]=\s*[\"'](sync|async|free)[\"']"
)


@pytest.mark.parametrize("module", ["swarm/client.py", "swarm/rounds.py", "config.py"])
def test_no_module_branches_on_the_exchange_modes_name(module):
    text = (PACKAGE / module).read_text()
    assert MODE_BRANCH.findall(text) == [], f"{module} branches on the exchange mode: move it into the mode's class"


OLD_NAMES = re.compile(
    r"LockStep|FreeRunning|PerSenderWindow|ArrivalQueue|lock_step|free_running|[Ll]ock-step|[Ff]ree-running|\bBackground\b"
)


def test_the_swarm_names_each_mode_one_way():
    """The config's values (`sync`, `async`, `free`) name the modes, their modules and classes (`sync_mode.SyncMode`,
    `SyncWindow`, ...): no second vocabulary in the swarm or the registry."""
    files = [*(PACKAGE / "swarm").rglob("*.py"), PACKAGE / "exchange_mode_registry.py"]
    named = {str(path.relative_to(PACKAGE)): OLD_NAMES.findall(path.read_text(encoding="utf-8")) for path in files}
    assert {path: names for path, names in named.items() if names} == {}


# The second vocabulary in prose: the modes are "the sync mode", "the async mode" and "the free mode".
OLD_WORDS = re.compile(r"\b(?:[Ll]ock[- ]step|[Ff]ree[- ]running|[Bb]ackground mode|LockStep|FreeRunning)\b")


def test_the_package_and_the_docs_name_each_mode_one_way():
    """No module of the package and no page of the docs (guides, results, studies) or the README calls a mode by an
    old name (the benchmark scripts' and result files' own names, such as `free_running.py`, are not words here)."""
    root = PACKAGE.parents[1]
    files = [*PACKAGE.rglob("*.py"), root / "README.md", *(root / "docs").rglob("*.md")]
    named = {str(path.relative_to(root)): OLD_WORDS.findall(path.read_text(encoding="utf-8")) for path in files}
    assert {path: words for path, words in named.items() if words} == {}


def test_the_old_words_are_caught():
    text = "peers in lock-step, Free running copies, the background mode, LockStep, FreeRunning; not free_running.py"
    assert OLD_WORDS.findall(text) == ["lock-step", "Free running", "background mode", "LockStep", "FreeRunning"]


def test_the_registry_holds_the_three_modes_with_their_windows():
    assert [exchange_mode(name) for name in EXCHANGE_MODE_NAMES] == [SyncMode, AsyncMode, FreeMode]
    assert [EXCHANGE_MODES[name].horizontal for name in EXCHANGE_MODE_NAMES] == [True, False, False]
    assert [mode.window for mode in (SyncMode, AsyncMode, FreeMode)] == [
        SyncWindow,
        SyncWindow,
        FreeWindow,
    ]
    assert [mode.horizontal for mode in (SyncMode, AsyncMode, FreeMode)] == [True, False, False]
    assert FreeMode.drop_reasons.keys() == {"stale"} and SyncMode.drop_reasons == AsyncMode.drop_reasons == {}


def test_the_config_knows_the_modes_without_importing_the_swarms_modules():
    code = (
        "import sys\n"
        "from trl_ftis.config import FTISConfig\n"
        "from trl_ftis.exchange_mode_registry import EXCHANGE_MODE_NAMES\n"
        "print(EXCHANGE_MODE_NAMES, sorted(m for m in sys.modules if m.startswith('trl_ftis.swarm.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "['sync', 'async', 'free'] []", result.stdout + result.stderr


class EverySecondStep(SyncMode):
    """The worked example of docs/swarm.md: sync-mode rounds at even steps only."""

    name = "every_second_step"

    def round(self, own_rows, round):
        if round % 2:
            return RoundOutcome([], None, {})  # an odd step: no exchange, own rows only
        return super().round(own_rows, round)


@pytest.fixture
def every_second_step():
    with registered_mode(EverySecondStep) as mode:
        yield mode


def test_a_fourth_mode_is_one_class_and_one_registration(tokenizer, make_args, every_second_step):
    url = f"memory://modes-{uuid.uuid4().hex}"
    partner = make_swarm(url, "partner", tokenizer)
    for step in range(3):
        partner.publish(rows("partner", count=8), step)
    trainer = exchange_trainer(tokenizer, make_args, url, "every_second_step", max_steps=3, peer_timeout=0.0)
    assert isinstance(trainer._rounds.mode, EverySecondStep)
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    # Steps 0 and 2 ran a round (they published: bytes sent), step 1 did not; step 0 trained on the partner's rows.
    assert ["ftis/exchange/bytes_sent" in entry for entry in steps] == [True, False, True]
    assert steps[0]["ftis/peer_rows"] > 0 and steps[1]["ftis/peer_rows"] == 0
    assert "every_second_step" in EXCHANGE_MODE_NAMES  # a command line's choice too


def test_an_unknown_or_taken_mode_name_is_refused(tmp_path, every_second_step):
    with pytest.raises(ValueError, match="exchange_mode must be one of"):
        FTISConfig(str(tmp_path), use_cpu=True, exchange_mode="every_third_step")

    class Impostor(SyncMode):
        name = "every_second_step"

    with pytest.raises(ValueError, match="already registered"):
        register_exchange_mode(Impostor)
    with pytest.raises(ValueError, match="cannot be combined with collaboration_mode='horizontal'"):
        FTISConfig(str(tmp_path), use_cpu=True, exchange_mode="free", collaboration_mode="horizontal")
