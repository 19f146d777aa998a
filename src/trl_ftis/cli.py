"""The `trl-ftis` command line.

    trl-ftis swarm CONFIG.yaml [--run-dir DIR] [--dry-run] [--grace SECONDS]

Each subcommand is one `_add_<name>(subparsers)` function that registers its parser and sets `func` to a handler
taking the parsed arguments and returning an exit code; to add a subcommand, write such a function and list it in
`SUBCOMMANDS`. Handlers import what they need when they run, so `trl-ftis --help` and `import trl_ftis.cli` stay
fast.
"""

from __future__ import annotations

import argparse
import sys


def _add_swarm(subparsers) -> None:
    parser = subparsers.add_parser(
        "swarm",
        help="start every peer of a swarm on this machine and supervise them",
        description=(
            "Start every peer listed in CONFIG.yaml as its own job (own process group, own accelerate port), "
            "stream their output prefixed with the peer id, stop all of them when one fails or on Ctrl-C, and print "
            "a summary table. Exit code: 0 all peers succeeded, 1 a peer failed, 2 invalid config, 130 interrupted. "
            "See docs/swarm-launcher.md for the config schema."
        ),
    )
    parser.add_argument("config", help="swarm config (YAML)")
    parser.add_argument(
        "--run-dir", help="where logs, peer outputs and summary.json go (overrides the config's run_dir)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print each peer's command and environment; start nothing"
    )
    parser.add_argument(
        "--grace",
        type=_non_negative_float,
        default=10.0,
        metavar="SECONDS",
        help="when stopping peers, seconds between SIGTERM and SIGKILL (default: 10)",
    )
    parser.set_defaults(func=_run_swarm)


def _run_swarm(args: argparse.Namespace) -> int:
    from . import launcher  # here, not at the top: keeps the CLI fast for other subcommands

    try:
        config = launcher.load_swarm_config(args.config, run_dir=args.run_dir)
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


def _add_demo(subparsers) -> None:
    subparsers.add_parser(
        "demo",
        help="run the embedded demo: a SmolLM2 swarm (full, LoRA, pruned) on word problems, on this CPU",
        description="Run the embedded demo (what `make demo` runs); `trl-ftis demo --help` lists its options.",
    )
    # `main` hands everything after `demo` to trl_ftis.demo.main before this parser runs.


# One registration function per subcommand, in the order `--help` lists them.
SUBCOMMANDS = [_add_swarm, _add_demo]


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
