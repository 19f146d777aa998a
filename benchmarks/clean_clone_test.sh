#!/usr/bin/env bash
# `make test` from a clean clone, as CI runs it: clone this repository's HEAD (committed files only) into a fresh
# folder, run `make test` there (set-up of .venv included), and record the output. `--runs N` repeats it N times in a
# row, each from its own fresh clone; `--load` keeps one CPU-bound process (a Python busy loop) running beside the
# whole time, to show that no test's verdict depends on how fast one process runs next to another.
#
#   bash benchmarks/clean_clone_test.sh                      # one quiet run
#   bash benchmarks/clean_clone_test.sh --load --runs 3      # three in a row with a busy process beside them
#
# The raw output goes to benchmarks/results/make-test-clean-clone-<commit>[-under-load].txt (or --out FILE); its first
# line is the command, the commit and the machine, and each run ends with a line `run K: rc=... wall=...s`.
set -u

runs=1
load=0
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --load) load=1 ;;
        --runs) runs="$2"; shift ;;
        --out) out="$2"; shift ;;
        *) echo "unknown argument: $1 (use --load, --runs N, --out FILE)" >&2; exit 2 ;;
    esac
    shift
done

repo=$(git rev-parse --show-toplevel)
full_commit=$(git -C "$repo" rev-parse HEAD)  # every run checks out this commit, whatever is committed meanwhile
commit=$(git -C "$repo" rev-parse --short HEAD)
changed=$(git -C "$repo" status --porcelain --untracked-files=no | wc -l)
suffix=$([ "$load" = 1 ] && echo "-under-load" || true)
out=${out:-$repo/benchmarks/results/make-test-clean-clone-$commit$suffix.txt}

hog=""
if [ "$load" = 1 ]; then
    python3 -c "while True: pass" &
    hog=$!
fi
trap '[ -n "$hog" ] && kill "$hog" 2>/dev/null' EXIT

{
    echo "# bash benchmarks/clean_clone_test.sh $([ "$load" = 1 ] && echo "--load ")--runs $runs" \
        "(at $commit, $changed tracked file(s) changed and not committed, which a clone leaves out;" \
        "$(nproc) CPU cores; $([ "$load" = 1 ] && echo "a Python busy loop running beside every run" || echo "nothing else started"))"
    failed=0
    for run in $(seq 1 "$runs"); do
        folder=$(mktemp -d "${TMPDIR:-/tmp}/ftis-clean-clone.XXXXXX")
        git clone --quiet "$repo" "$folder/repo" && git -C "$folder/repo" checkout --quiet "$full_commit"
        echo "## run $run of $runs: git clone $repo $folder/repo && git checkout $commit && cd $folder/repo && make test"
        start=$(date +%s)
        (cd "$folder/repo" && make test)
        code=$?
        echo "run $run: rc=$code wall=$(( $(date +%s) - start ))s"
        [ "$code" = 0 ] || failed=1
        rm -rf "$folder"
    done
    echo "all runs passed: $([ "$failed" = 0 ] && echo yes || echo no)"
} 2>&1 | tee "$out"
