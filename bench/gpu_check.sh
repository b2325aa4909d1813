#!/usr/bin/env bash
# The checks that need a GPU, in one run of under 5 minutes (issue 33, part 6):
#   1. the shape matrix on CUDA (tests/integration/inference/test_shapes.py, the cuda cells:
#      every zoo BlenderBot shape and bart, batched search and continuous scheduler, against
#      ParlAI's own agent on the same device);
#   2. bench.peer's cells, quick plan;
#   3. bench.continuous --quick.
# Usage, from the repository root on a machine with a CUDA device:  bash bench/gpu_check.sh
# Exit status: that of the first step that failed (the later ones still run).
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
status=0
step() {
    local limit=$1; shift
    echo "== $* (at most ${limit} s)"
    local started=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "== rc=$rc after $((SECONDS - started)) s"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: nothing to check here")' || exit 2
"$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__)'
step 120 "$PY" -m pytest tests/integration/inference/test_shapes.py -m "" -k cuda -q -rA -s
step 90 "$PY" -m bench.peer --quick
step 90 "$PY" -m bench.continuous --quick
exit "$status"
