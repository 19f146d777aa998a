"""How long a peer's last message (`Swarm.leave`) holds up the end of a run when its Redis server is down: the
announcement as sent before issue 23's fix (the transport's own retries, up to `connect_timeout`) and as sent now
(`LEAVE_PATIENCE`), side by side in one run, each on a fresh client facing a fresh outage of a real redis-server.

    python benchmarks/leave_redis_down.py | tee benchmarks/results/leave-redis-down.txt

One process, two `Swarm` clients on the tiny character tokenizer (no training): only the publish is timed.
"""

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from trl_ftis.demo.tiny import build_char_tokenizer  # noqa: E402
from trl_ftis.exchange import Message, encode_message, tokenizer_fingerprint  # noqa: E402
from trl_ftis.swarm.client import LEAVE_PATIENCE, Swarm  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("needs redis-server on PATH")
    tokenizer = build_char_tokenizer()
    port = free_port()
    folder = tempfile.mkdtemp()
    proc = subprocess.Popen([server, "--port", str(port), "--save", "", "--dir", folder], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    url = f"redis://127.0.0.1:{port}/0"
    settings = dict(tokenizer_fingerprint=tokenizer_fingerprint(tokenizer), tokenizer_name="char",
                    vocab_limit=len(tokenizer), temperature=1.0, reward_names=[])  # fmt: skip
    before, now = Swarm(url, peer_id="before", **settings), Swarm(url, peer_id="now", **settings)
    proc.terminate()
    proc.wait()
    final = Message(
        sender="before",
        round=0,
        tokenizer_fingerprint=settings["tokenizer_fingerprint"],
        tokenizer_name="char",
        temperature=1.0,
        reward_names=[],
        groups=[],
        completions=[],
        final=True,
    )
    start = time.monotonic()
    try:
        before.transport.publish(encode_message(final), sender="before", round=0)  # what leave() sent before
    except Exception as error:  # noqa: BLE001 - the outage is what is measured
        print(f"before: {type(error).__name__}")
    seconds_before = time.monotonic() - start
    start = time.monotonic()
    sent = now.leave()
    seconds_now = time.monotonic() - start
    print(f"connect_timeout {before.transport.connect_timeout:g} s, LEAVE_PATIENCE {LEAVE_PATIENCE:g} s")
    print(f"announcement as before: {seconds_before:.2f} s; Swarm.leave now: {seconds_now:.2f} s (sent: {sent})")
    print(f"ratio now / before: {seconds_now / seconds_before:.3f}")


if __name__ == "__main__":
    main()
