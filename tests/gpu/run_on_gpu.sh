#!/usr/bin/env bash
# The CUDA code paths, which this repository's CI never runs (it has no GPU): run this on a host
# with one, from the repository root or anywhere, in a few minutes.
#
#   tests/gpu/run_on_gpu.sh            # every test marked gpu; extra arguments go to pytest
#
# Needs a torch build with CUDA in the interpreter it runs (PYTHON, default .venv/bin/python,
# else python3): the locked CPU-only torch wheel cannot see a GPU. It refuses to run, rather than
# report skips as a pass, when torch sees no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$PYTHON" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device: nothing here would run")
print(f"torch {torch.__version__}, {torch.cuda.device_count()} CUDA device(s): {torch.cuda.get_device_name(0)}")
PY
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# -rs lists any skip with its reason; none is expected on a CUDA host.
exec "$PYTHON" -m pytest -m gpu -q -rs --timeout 300 \
    tests/transfer/test_gpu_staging.py \
    tests/daemons/model/test_device.py \
    tests/daemons/workers/test_kv_on_device.py \
    tests/daemons/serving/test_cuda_serving.py "$@"
