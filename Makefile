# The two commands of the README's quick start (train, test), and check for
# the edit-test loop. Each sets up what it needs.
# TOWERPS_EXTRA=gpu make ... installs GPU TensorFlow into .venv (default: cpu).
.PHONY: setup train test check

setup:
	@scripts/setup.sh

# A real local training job: 2 PS shards and 2 workers in a local Ray cluster.
train: setup
	.venv/bin/towerps train --dataset fashion_mnist --num-workers 2 --num-ps 2 \
		--batch-size 128 --steps 1000

# The whole test suite, slow and multi-process tiers included (what CI runs),
# ending with its 30 slowest tests: the ones to shorten when the suite grows.
# Two pytest-xdist processes share the 2 cores: much of a Ray test is waiting
# (process start-up, a shard's barrier), and tests/conftest.py keeps the tests
# that share a Ray cluster or the cluster tier's nodes in one process.
# Its set-up also installs what the cluster tier needs (openssh-server, rsync).
# -X faulthandler: a crash, even at the interpreter's exit, prints every thread's stack.
test:
	@scripts/setup.sh --tests
	.venv/bin/python -X faulthandler -m pytest -n 2 -ra --durations=30

# The edit-test loop: the unit and rpc tiers only (no Ray, no subprocess
# clusters), under two minutes on 2 cores. `make test` before a commit.
check: setup
	.venv/bin/python -m pytest -q -n 2 -m "unit or rpc" -p no:cacheprovider
