"""The `trl-ftis` command line.

    trl-ftis swarm CONFIG.yaml [--run-dir DIR] [--dry-run] [--grace SECONDS] [--slurm] [--only PEER_ID ...] [--resume]
    trl-ftis keygen PEER_ID [--dir DIR] [--keys-file FILE]
    trl-ftis pays LAUNCHER_RUN_DIR
    trl-ftis pays RUN_DIR [RUN_DIR ...] --phi EST [LOW HIGH] --beta EST [LOW HIGH] [--peers P]

Each subcommand is one `_add_<name>(subparsers)` function that registers its parser and sets `func` to a handler
taking the parsed arguments and returning an exit code; to add a subcommand, write such a function and list it in
`SUBCOMMANDS`. Handlers import what they need when they run, so `trl-ftis --help` and `import trl_ftis.cli` stay
fast.
"""

from __future__ import annotations

import argparse
import math
import sys


def _add_swarm(subparsers) -> None:
    parser = subparsers.add_parser(
        "swarm",
        help="start every peer of a swarm on this machine (or one SLURM job each) and supervise them",
        description=(
            "Start every peer listed in CONFIG.yaml as its own job (own process group, own accelerate port), "
            "stream their output prefixed with the peer id, stop all of them when one fails or on Ctrl-C, and print "
            "a summary table. With `launcher: slurm` in the config (or --slurm) every peer is one SLURM job instead, "
            "submitted with submitit, and Ctrl-C or a failing peer cancels every job. At the end, a warning line for "
            "each peer that accepted no peer rows, dropped more than it accepted or refused most messages (or any "
            "for their signature: a swarm secret some peer lacks). An earlier run's logs/<id>.log and .cmd are kept "
            "as logs/<id>.log.<N> and .cmd.<N>. Exit code: 0 all peers succeeded, 1 a peer failed, 2 invalid "
            "config, 130 interrupted. See docs/swarm-launcher.md for the config schema and for restarting one peer."
        ),
    )
    parser.add_argument("config", help="swarm config (YAML)")
    parser.add_argument(
        "--run-dir", help="where logs, peer outputs and summary.json go (overrides the config's run_dir)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print each peer's command and environment (on SLURM: each job's sbatch options and script); start "
        "nothing",
    )
    from .launcher.backends import backend_kind, backend_names

    for name in backend_names():  # each backend's own flag (`--slurm`): it runs the swarm whatever the config says
        kind = backend_kind(name)
        if kind.cli_flag:
            parser.add_argument(kind.cli_flag, dest="backend", action="store_const", const=name, help=kind.cli_help)
    parser.add_argument(
        "--grace",
        type=_non_negative_float,
        default=10.0,
        metavar="SECONDS",
        help="when stopping peers, seconds between SIGTERM and SIGKILL (on SLURM: and scancel) (default: 10)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PEER_ID",
        help="start only this peer, with the command the full run gives it (repeat for several); the others are "
        "not touched: to restart a peer while the rest keep training, run each peer with its own --only launcher. "
        "Not with a Redis job the launcher starts (SLURM's default exchange): name your own exchange_url",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="each peer started resumes from the newest complete checkpoint-<step> in its output dir "
        "(--resume_from_checkpoint PATH); one without a checkpoint yet starts from the beginning",
    )
    parser.set_defaults(func=_run_swarm, backend=None)


def _run_swarm(args: argparse.Namespace) -> int:
    from . import launcher  # here, not at the top: keeps the CLI fast for other subcommands

    try:
        config = launcher.load_swarm_config(args.config, run_dir=args.run_dir, backend=args.backend)
        config, said = launcher.restart_config(config, only=args.only, resume=args.resume)
        for line in said:  # which checkpoint each peer resumes from, before its output starts
            print(f"# {line}" if args.dry_run else f"trl-ftis swarm: {line}", flush=True)
        if args.dry_run:
            return launcher.dry_run(config)
        return launcher.run_swarm(config, grace=args.grace)
    except launcher.SwarmConfigError as exc:
        print(f"trl-ftis swarm: error: {exc}", file=sys.stderr)
        return 2


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _add_keygen(subparsers) -> None:
    parser = subparsers.add_parser(
        "keygen",
        help="create a peer's Ed25519 key pair (per-peer keys: identity, not just membership)",
        description=(
            "Write PEER_ID's private key to DIR/PEER_ID.key (PEM, mode 0600; an existing file is never replaced) and "
            "print, on stdout, the line to add to the swarm's public-key file (`FTISConfig.peer_keys_file`), e.g. "
            "`trl-ftis keygen peer-a >> peers.yaml`; with --keys-file the line is added to that file directly. Give "
            "the key file to that peer only (`--private_key_file`) and the public-key file to every peer. The "
            "public-key file is written mode 0644 whatever the umask; a warning names a key file or folder that "
            "others can write. Exit code: 0 written, 1 a key for PEER_ID exists already, 2 invalid arguments or "
            "files. See docs/swarm.md."
        ),
    )
    parser.add_argument("peer_id", metavar="PEER_ID", help="the peer's id (FTISConfig.peer_id)")
    parser.add_argument("--dir", default=".", help="where to write PEER_ID.key (created if missing; default: .)")
    parser.add_argument(
        "--keys-file",
        metavar="FILE",
        help="a public-key file (YAML, or JSON when it ends in .json) to add PEER_ID's public key to (created if "
        "missing); refused when it already has a key for PEER_ID",
    )
    parser.set_defaults(func=_run_keygen)


def _run_keygen(args: argparse.Namespace) -> int:
    import json
    import os
    from pathlib import Path

    from .exchange import keys
    from .peer_ids import peer_id_problem

    def fail(code: int, text: str) -> int:
        print(f"trl-ftis keygen: error: {text}", file=sys.stderr)
        return code

    problem = peer_id_problem(args.peer_id)
    if problem is not None:
        return fail(2, f"PEER_ID: {problem}")
    keys_file = Path(args.keys_file).expanduser() if args.keys_file else None
    registered: dict[str, str] = {}
    existing = ""
    if keys_file is not None and keys_file.exists():
        try:
            existing = keys_file.read_text(encoding="utf-8")
            if existing.strip():
                registered = {
                    peer: keys.public_key_text(key) for peer, key in keys.load_public_keys(keys_file).items()
                }
        except (keys.KeyFileError, OSError, UnicodeDecodeError) as error:  # checked before anything is written
            return fail(2, f"--keys-file {str(keys_file)!r}: {error}")
        if args.peer_id in registered:
            return fail(1, f"{str(keys_file)!r} already has a key for {args.peer_id!r}; nothing was written.")
    directory = Path(args.dir).expanduser()
    path = directory / f"{args.peer_id}.key"
    if path.exists():
        return fail(1, f"{str(path)!r} exists; refusing to replace a private key (delete it first to make a new one).")
    private_key, _ = keys.generate_keypair()
    text = keys.public_key_text(private_key)
    # Both quoted: YAML would read an id such as 123 or true as a number or a boolean.
    line = f"{json.dumps(args.peer_id)}: {json.dumps(text)}"
    staged = None
    if keys_file is not None:
        # Check, then write: the new public-key file is written beside the old one and read back as peers will read
        # it before the private key is written; it replaces the old file only once the private key is saved.
        if keys_file.suffix.lower() == ".json":
            content = json.dumps({**registered, args.peer_id: text}, indent=2, sort_keys=True) + "\n"
        else:
            content = existing + ("" if not existing or existing.endswith("\n") else "\n") + line + "\n"
        staged = keys_file.with_name(f".{keys_file.name}.keygen-{os.getpid()}")
        try:
            # Mode 0644 whatever the umask, and never through a file or link someone else put there.
            keys.write_public_file(staged, content, exclusive=True)
            keys.load_public_keys(staged)
        except (keys.KeyFileError, OSError) as error:
            staged.unlink(missing_ok=True)
            return fail(
                2, f"--keys-file {str(keys_file)!r}: cannot add {args.peer_id!r}: {error}; nothing was written."
            )
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        keys.save_private_key(path, private_key)
    except (FileExistsError, OSError) as error:
        if staged is not None:
            staged.unlink(missing_ok=True)
        if isinstance(error, FileExistsError):
            return fail(1, f"{str(path)!r} exists; refusing to replace a private key (delete it first).")
        return fail(2, f"cannot write {str(path)!r}: {error.strerror or error}; nothing was written.")
    if staged is not None:
        os.replace(staged, keys_file)  # same directory: atomic
    print(
        f"Wrote {str(path)!r} (mode 0600): give it to peer {args.peer_id!r} only (--private_key_file).",
        file=sys.stderr,
    )
    # Whoever can change a key file (or replace it in its folder) can sign as this peer or register keys of their own.
    for problem in keys.key_file_problems(path) + (keys.key_file_problems(keys_file) if keys_file else []):
        print(f"trl-ftis keygen: warning: {problem}", file=sys.stderr)
    if keys_file is not None:
        print(f"Added {args.peer_id!r} to {str(keys_file)!r}.", file=sys.stderr)
    else:
        print("Add this line to the swarm's public-key file (--peer_keys_file):", file=sys.stderr)
    print(line)
    return 0


def _add_pays(subparsers) -> None:
    parser = subparsers.add_parser(
        "pays",
        help="what joining the swarm was worth: from a launcher run's controls, or predicted from runs' summaries",
        description=(
            "Given a launcher run directory (one with summary.json, run with `controls: [alone, alone-rows]`): for "
            "each swarm peer, how long its controls took to a target accuracy against it, phi and beta, and the "
            "predicted wall-time ratio from that run's own measurements; intervals over seeds where the config "
            "had `seeds:`. Given run output dirs instead: exactly one swarm peer's, and optionally alone runs of the "
            "same model and task generating P x B rows a step (A_N) and B rows (A_N/P), with phi and beta given; "
            "every factor not measured is assumed and said so, and then no verdict is given. See "
            "docs/when-it-pays.md."
        ),
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="a launcher run directory, or runs' output_dirs (or their ftis_summary.json)",
    )
    parser.add_argument("--phi", nargs="+", type=float, metavar="X",
                        help="phi: an estimate, or an estimate and its interval (EST LOW HIGH)")  # fmt: skip
    parser.add_argument(
        "--beta",
        nargs="+",
        type=float,
        metavar="X",
        help="beta: an estimate, or an estimate and its interval (EST LOW HIGH); beta > 0",
    )
    parser.add_argument(
        "--partners",
        choices=["copy", "hetero"],
        help="take phi and beta (those not given) from this library's own measurement at P = 2 or 4: "
        "copy = copies of one model, hetero = a learner fed by smaller partners' rows (tiny models "
        "on carry chains; docs/benchmarks.md section 17.4); assumed for your task, so no verdict",
    )
    parser.add_argument(
        "--peers",
        type=int,
        default=None,
        metavar="P",
        help="the swarm's size P (default: the peer's rows trained / own rows generated, rounded)",
    )
    parser.set_defaults(func=_run_pays)


def _interval(name: str, values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise ValueError(f"--{name} takes an estimate, or an estimate and an interval: EST LOW HIGH")
    estimate, low, high = values
    if not all(map(math.isfinite, values)) or not low <= estimate <= high:
        raise ValueError(f"--{name} {estimate} {low} {high}: need finite LOW <= EST <= HIGH")
    return estimate, low, high


def _run_pays(args: argparse.Namespace) -> int:
    from . import pays, worth_report

    try:
        if len(args.runs) == 1 and worth_report.is_launcher_run(args.runs[0]):
            if args.phi is not None or args.beta is not None or args.partners is not None:
                raise ValueError("a launcher run measures phi and beta itself: drop --phi, --beta and --partners")
            print(worth_report.launcher_run_report(args.runs[0]))
            return 0
        if args.partners is None and (args.phi is None or args.beta is None):
            raise ValueError(
                "give --phi and --beta, or --partners copy|hetero for the values measured here (or a launcher run "
                "directory with controls, which measures them)"
            )
        hardware, _ = pays.factors_from_summaries(args.runs, peers=args.peers)
        measured = pays.measured_learning(args.partners, hardware.peers) if args.partners else {}
        phi = _interval("phi", args.phi) if args.phi is not None else measured["phi"]
        beta = _interval("beta", args.beta) if args.beta is not None else measured["beta"]
        if beta[1] <= 0:
            raise ValueError("--beta must be > 0")
        taken = [name for name in ("phi", "beta") if getattr(args, name) is None]
        if taken:
            print(f"{' and '.join(taken)} as measured here for --partners {args.partners} at P = {hardware.peers} "
                  "(tiny models on carry chains; assumed for your task)")  # fmt: skip
        print(pays.format_report(hardware, phi, beta, assumed_learning=taken))
    except ValueError as error:
        print(f"trl-ftis pays: {error}", file=sys.stderr)
        return 2
    return 0


def _add_demo(subparsers) -> None:
    subparsers.add_parser(
        "demo",
        help="run the embedded demo: a SmolLM2 swarm (full, LoRA, pruned) on word problems, on this CPU",
        description="Run the embedded demo (what `make demo` runs); `trl-ftis demo --help` lists its options.",
    )
    # `main` hands everything after `demo` to trl_ftis.demo.main before this parser runs.


# One registration function per subcommand, in the order `--help` lists them.
SUBCOMMANDS = [_add_swarm, _add_keygen, _add_pays, _add_demo]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="trl-ftis", description="Collaborative GRPO across heterogeneous models with F-TIS."
    )
    parser.add_argument("--version", action="version", version=f"trl-ftis {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the subcommand and return its exit code (argparse errors: 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:  # the demo parses its own options (including --help)
        from .demo import main as demo_main

        try:
            return demo_main(argv[1:])
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a usage error: return the code instead of exiting
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
