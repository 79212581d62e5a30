"""Reproducible measurements of towerps that write JSON (not timed tests).

Each benchmark is one file, run as a script from the checkout or through the
CLI, and writes benchmarks/results/NAME.json plus a one-line summary:

    .venv/bin/python benchmarks/NAME.py [--tiny] [--out PATH]
    .venv/bin/towerps bench NAME [--tiny] [--out PATH]

`_common.py` holds what they share (flags, machine facts, the JSON). See
benchmarks/README.md for the latest figures.
"""
