# The two commands of the README's quick start. Each sets up what it needs.
.PHONY: setup train test

setup:
	@scripts/setup.sh

# A real local training job: 2 PS shards and 2 workers in a local Ray cluster.
train: setup
	.venv/bin/towerps train --dataset fashion_mnist --num-workers 2 --num-ps 2 \
		--batch-size 128 --steps 1000

# The whole test suite, slow and multi-process tiers included (what CI runs).
test: setup
	.venv/bin/python -m pytest -ra
