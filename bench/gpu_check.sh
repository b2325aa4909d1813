#!/usr/bin/env bash
# The checks that need a GPU, in one run of under 5 minutes (issue 33, part 6):
#   1. the shape matrix on CUDA (tests/integration/inference/test_shapes.py, the cuda cells:
#      every zoo BlenderBot shape and bart, batched search and continuous scheduler, against
#      ParlAI's own agent on the same device);
#   2. bench.peer's cells (quick plan: greedy and beam 4, batches 1 and 8) on the GPU, for our
#      fp32 search under both schedulers, ours in bf16, HF transformers and CTranslate2;
#   3. bench.continuous --quick on the GPU, its windows shortened to fit (every part of it:
#      capacity, the load points, the drafts, the shipped model).
# Each step has its own time limit (70 + 100 + 115 s; a step past it is stopped and reported,
# rc=124) and prints its RESULT lines as it ends; the JSON files are bench/results/*-cuda.json.
# Usage, from the repository root on a machine with a CUDA device:  bash bench/gpu_check.sh
# (PY=/path/to/python to use another interpreter than .venv/bin/python).
# Exit status: 2 where there is no CUDA device (nothing is run), else that of the first step
# that failed (the later ones still run).
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ ! -x "$PY" ]; then
    echo "bench/gpu_check.sh: no Python at $PY: run 'make install' first, or set PY=..." >&2
    exit 2
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "bench/gpu_check.sh: torch sees no CUDA device on this machine" \
        "(torch.cuda.is_available() is false), so there is nothing to check here." \
        "Run it on a machine with a GPU and a CUDA build of torch; on this one," \
        "'make test' runs the matrix's CPU cells (the CUDA ones skip with that reason)." >&2
    exit 2
fi
"$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__)'
status=0
started_all=$SECONDS
step() {
    local limit=$1; shift
    echo "== $* (at most ${limit} s)"
    local started=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "== rc=$rc after $((SECONDS - started)) s"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}
step 70 "$PY" -m pytest tests/integration/inference/test_shapes.py -m "" -k cuda -q -rA -s \
    -p no:cacheprovider
step 100 "$PY" -m bench.peer --quick --device cuda --rounds 2 \
    --systems ours_batch_fp32,ours_cont_fp32,ours_cont_bf16,hf_fp32,ct2_fp32,ct2_int8
step 115 "$PY" -m bench.continuous --quick --device cuda --seconds 4 --warm-up 2
echo "== all steps: $((SECONDS - started_all)) s, exit status $status"
exit "$status"
