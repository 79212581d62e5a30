"""Shared fixtures. Each test tier has its own folder and marker:
unit (no Ray, no sockets), rpc (real gRPC servers on port 0), ray (one
module-scoped local Ray cluster), cluster (several real Ray nodes), slow."""

import os

# Quiet TensorFlow's C++ start-up logs in every test process.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
