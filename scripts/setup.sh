#!/usr/bin/env bash
# Set up a towerps checkout: a virtual environment in .venv with towerps
# (editable) and its test tools, and what the machine needs from Debian where
# it can be had. Idempotent and quick when nothing changed. The gRPC stubs are
# committed (proto/towerps_pb2*.py); scripts/generate_protos.py regenerates them.
#
#   scripts/setup.sh            .venv and Fashion-MNIST (what `make train` needs)
#   scripts/setup.sh --tests    also openssh-server and rsync (`make test`: tests/cluster)
#
# TOWERPS_EXTRA=gpu installs GPU TensorFlow into .venv instead of the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
extra=${TOWERPS_EXTRA:-cpu}  # towerps' TensorFlow extra: cpu or gpu (pyproject.toml)
[[ $extra == cpu || $extra == gpu ]] || { echo "TOWERPS_EXTRA must be cpu or gpu, not '$extra'" >&2; exit 2; }
stamp=.venv/.towerps-installed  # holds the extra .venv was installed with (empty: cpu)
installed=$(cat "$stamp" 2>/dev/null || true)
if [[ -f $stamp && ${installed:-cpu} != "$extra" ]]; then
    # The other extra's TensorFlow would stay beside this one's: start afresh.
    echo "note: .venv has towerps[${installed:-cpu}]; making a new one for towerps[$extra]"
    rm -rf .venv
fi
if [[ ! -x .venv/bin/python ]]; then
    "$python" -m venv .venv
fi
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # setuptools' notes on editable installs are information: filtered out
    # (scripts/quiet_editable.awk); pip's status stays the pipeline's (pipefail).
    .venv/bin/python -m pip install --quiet -e ".[$extra,test]" 2>&1 \
        | awk -f scripts/quiet_editable.awk >&2
    echo "$extra" > "$stamp"
fi

# Debian packages, each with a file that shows it is installed.
declare -A shows=(
    [dataset-fashion-mnist]=/usr/share/datasets/fashion-mnist  # the real data set
    [openssh-server]=/usr/sbin/sshd  # tests/cluster: `ray up` over SSH
    [rsync]=/usr/bin/rsync           # ...which copies the checkout with rsync
)
wanted=(dataset-fashion-mnist)
[[ ${1:-} != --tests ]] || wanted+=(openssh-server rsync)
missing=()
for package in "${wanted[@]}"; do
    [[ -e ${shows[$package]} ]] || missing+=("$package")
done
[[ ${#missing[@]} -gt 0 ]] || exit 0

if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "note: ${missing[*]} not installed; on Debian/Ubuntu: sudo apt-get install ${missing[*]}"
    echo "      (without Fashion-MNIST towerps downloads it where the network allows;" \
         "without openssh-server and rsync the cluster tests are skipped)"
    exit 0
fi
# The tests start sshds of their own on 127.0.0.2:22 and 127.0.0.3:22; the
# package's own sshd (0.0.0.0:22) would take those addresses. This file keeps
# Debian from starting it, now and at boot (its init script, runit service and
# systemd units all honour it); an sshd installed before is left as it was.
if [[ " ${missing[*]} " == *" openssh-server "* ]]; then
    mkdir -p /etc/ssh && touch /etc/ssh/sshd_not_to_be_run
fi
export DEBIAN_FRONTEND=noninteractive
install=(apt-get install -y -q --no-install-recommends "${missing[@]}")
"${install[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && "${install[@]}" >/dev/null; } ||
    echo "note: could not install ${missing[*]} (apt-get install ${missing[*]});" \
         "towerps downloads Fashion-MNIST where the network allows; the cluster tests need the others"
