#!/usr/bin/env bash
# The GPU check in one command (docs/benchmarks.md, "The GPU check"):
#
#   bash benchmarks/gpu_check.sh --prepare    # here, once: the wheels to carry, into benchmarks/gpu_wheels/
#   bash benchmarks/gpu_check.sh              # on the GPU machine: set-up and every stage, about 3-5 minutes
#   bash benchmarks/gpu_check.sh --dry-run    # tiny shapes on the CPU, every stage, in seconds
#   bash benchmarks/gpu_check.sh --cpu        # SmolLM2-135M's shape on the CPU: a few rows, short completions
#
# Results go to $OUT when it is set (a device call's output folder), else to --out, else to
# benchmarks/results/gpu_check-<mode>/: gpu_check.txt (the report, also printed), gpu_check.json, stages/, logs/.
# PYTHON picks the interpreter (default: python, else python3): on the GPU machine, the one with its torch.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
cd "$HERE/.." || exit 1
exec "$PYTHON" "$HERE/gpu_check.py" "$@"
