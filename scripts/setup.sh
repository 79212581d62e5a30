#!/usr/bin/env bash
# Set up a towerps checkout: a virtual environment in .venv with towerps
# (editable) and its test tools, and Debian's Fashion-MNIST where it can be had.
# Idempotent and quick when nothing changed. The gRPC stubs are committed
# (proto/towerps_pb2*.py); scripts/generate_protos.py regenerates them.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
stamp=.venv/.towerps-installed
if [[ ! -x .venv/bin/python ]]; then
    "$python" -m venv .venv
fi
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test]'
    touch "$stamp"
fi

fashion=/usr/share/datasets/fashion-mnist
if [[ ! -d $fashion ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null; } ||
            echo "note: could not install dataset-fashion-mnist; towerps will try to download Fashion-MNIST"
    else
        echo "note: $fashion is missing; on Debian/Ubuntu run 'sudo apt-get install dataset-fashion-mnist'" \
             "(otherwise towerps downloads Fashion-MNIST where the network allows)"
    fi
fi
