#!/usr/bin/env bash
# The GPU-only checks (pytest marker `gpu`), for a machine with an NVIDIA GPU:
# memory growth, a per-tower memory limit, GPU settings the machine cannot hold
# (an index that does not exist, a limit above the card's memory), and a GPU
# tower beside a CPU tower matching one tower. A few minutes at most.
#
#   .venv/bin/pip install -e '.[gpu,test]'    # TensorFlow with CUDA, once
#   scripts/gpu_checks.sh                     # PYTHON=... to use another interpreter
#
# Exit status: pytest's; 3 when the checks were skipped because TensorFlow
# saw no GPU (on a GPU machine that is a set-up problem, not a pass).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
report=$(mktemp -d)/gpu_checks.xml

echo "== GPUs"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi found no NVIDIA driver"
"$PYTHON" -c "import tensorflow as tf; print('TensorFlow', tf.__version__, 'sees', \
len(tf.config.list_physical_devices('GPU')), 'GPU(s)')"

echo "== gpu-marked tests"
"$PYTHON" -m pytest -m gpu -ra -p no:cacheprovider --junitxml="$report" tests
status=$?

"$PYTHON" - "$report" "$status" <<'PY'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
total, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
passed = total - failed - errors - skipped
print(f"== gpu checks: {passed} passed, {failed + errors} failed, {skipped} skipped")
if skipped and not (failed or errors):
    print("   skipped: TensorFlow saw no GPU here (install towerps[gpu] on a GPU machine)")
    sys.exit(3)
sys.exit(int(sys.argv[2]))
PY
