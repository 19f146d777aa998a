"""tests/provision_services.sh, which `make test` runs: it never fails, and says which tests will skip and why."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "provision_services.sh"
BASH = shutil.which("bash")


def _signals_as_in_a_terminal():
    # A shell cannot trap a signal that was ignored when it started, and a suite started in the background (`make test
    # &`, some CI runners) hands its processes SIGINT ignored: the script is run here as from a terminal.
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def _run(path: str) -> subprocess.CompletedProcess:
    env = {"PATH": path, "FTIS_PROVISION": "0"}  # never install from a test
    return subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_missing_services_are_reported_with_the_tests_that_skip_and_the_script_succeeds(tmp_path):
    result = _run(str(tmp_path))  # a PATH where neither redis-server nor slurmctld exists
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("redis-server unavailable" in line and "will be skipped" in line for line in lines), lines
    assert any("slurmctld unavailable" in line and "SLURM launcher tests will be skipped" in line for line in lines)


def test_services_on_path_are_found_and_nothing_is_installed(tmp_path):
    for program in ("redis-server", "slurmctld"):
        fake = tmp_path / program
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    result = _run(f"{tmp_path}{os.pathsep}/nonexistent")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["test services: redis-server found", "test services: slurmctld found"]


# --- installing, with fakes of `id` (root) and `apt-get`, and the policy file in a temporary folder ------------------
TOOLS = ("grep", "rm", "chmod", "timeout", "mkdir", "dirname", "sleep", "touch", "cat", "sh", "kill")
MARKER = "# written by trl-ftis tests/provision_services.sh; safe to delete"
FAKE_APT = """#!/bin/sh
# update: nothing; install: record the policy as seen, then do what $MODE says
[ "$1" = update ] && exit 0
echo "fake apt-get $*"
cat "$POLICY_FILE" > "$BIN/policy-during-install" 2>/dev/null
case "$(cat "$BIN/mode")" in
    ok) for program in redis-server slurmctld; do
            printf '#!/bin/sh\\n' > "$BIN/$program"; chmod 755 "$BIN/$program"
        done ;;
    fail) echo "E: Unable to locate package"; exit 100 ;;
    hang) echo $$ > "$BIN/apt-pid"; touch "$BIN/started"; exec sleep 120 ;;
esac
"""


def _fake_machine(tmp_path: Path, mode: str) -> tuple[dict, Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "apt-get").write_text(FAKE_APT)
    for name in ("id", "apt-get"):
        (bin_dir / name).chmod(0o755)
    (bin_dir / "mode").write_text(mode)
    policy, log = tmp_path / "policy-rc.d", tmp_path / "logs" / "services.log"
    env = {"PATH": str(bin_dir), "FTIS_POLICY_RC_D": str(policy), "POLICY_FILE": str(policy), "BIN": str(bin_dir)}
    return env, policy, log


def test_an_install_says_what_it_installs_keeps_apt_output_and_removes_its_policy(tmp_path):
    env, policy, log = _fake_machine(tmp_path, "ok")
    result = subprocess.run(
        [BASH, str(SCRIPT), str(log)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"test services: installing redis-server with apt-get (output in {log})", lines
    assert lines[1] == "test services: installed redis-server" and lines[2] == "test services: slurmctld found"
    assert "fake apt-get install -y -qq --no-install-recommends redis-server" in log.read_text()
    seen = (tmp_path / "bin" / "policy-during-install").read_text()
    assert MARKER in seen and "exit 101" in seen  # daemons were kept from starting during the install...
    assert not policy.exists()  # ...and the policy is gone after it


def test_a_failed_install_removes_its_policy_and_points_at_the_log(tmp_path):
    env, policy, log = _fake_machine(tmp_path, "fail")
    result = subprocess.run(
        [BASH, str(SCRIPT), str(log)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert f"installing redis-server failed (see {log}): the Redis transport" in result.stdout
    assert "E: Unable to locate package" in log.read_text()
    assert not policy.exists()


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_during_the_install_removes_the_policy_and_stops_apt(tmp_path, signal_name):
    """A cancelled CI job (TERM), Ctrl-C (INT) or a closed terminal (HUP) while apt-get runs: the script stops at
    once, stops apt-get, and leaves no policy-rc.d behind (which would keep every later install from starting its
    services)."""
    env, policy, log = _fake_machine(tmp_path, "hang")
    started = tmp_path / "bin" / "started"
    process = subprocess.Popen(
        [BASH, str(SCRIPT), str(log)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_signals_as_in_a_terminal,  # noqa: PLW1509 - the child only resets signal dispositions
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():  # the fake apt-get is running (the policy written before it)
            assert time.monotonic() < deadline and process.poll() is None, "the fake apt-get never started"
            time.sleep(0.05)
        assert policy.exists()
        process.send_signal(getattr(signal, signal_name))
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + getattr(signal, signal_name).value, err
    assert not policy.exists()
    assert f"stopped by {signal_name}" in err.decode()
    apt_pid = int((tmp_path / "bin" / "apt-pid").read_text())
    with pytest.raises(ProcessLookupError):  # apt-get was stopped and reaped, not left running
        os.kill(apt_pid, 0)


def test_a_policy_left_by_a_killed_run_is_removed_and_an_administrators_is_kept(tmp_path):
    env, policy, log = _fake_machine(tmp_path, "ok")
    policy.write_text(f"#!/bin/sh\n{MARKER}\nexit 101\n")  # what a run killed by SIGKILL leaves
    for program in ("redis-server", "slurmctld"):  # nothing to install this time: removed all the same
        (tmp_path / "bin" / program).symlink_to(tmp_path / "bin" / "sh")
    result = subprocess.run(
        [BASH, str(SCRIPT), str(log)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and not policy.exists()
    assert f"removed {policy}, left by an earlier, interrupted run" in result.stdout

    env, policy, log = _fake_machine(tmp_path / "admin", "ok")
    own = "#!/bin/sh\n# the administrator's\nexit 101\n"
    policy.write_text(own)
    result = subprocess.run(
        [BASH, str(SCRIPT), str(log)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and "installed redis-server" in result.stdout
    assert policy.read_text() == own  # used as it is during the install, never removed
