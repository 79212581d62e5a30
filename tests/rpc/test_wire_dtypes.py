"""Compact wire dtypes: half the bytes, float32 arithmetic on the shard."""

import ml_dtypes
import numpy as np
import pytest

from towerps.wire import WIRE_DTYPES
from towerps.workers.client import PSClient

from .conftest import random_variables

pytestmark = pytest.mark.rpc

# Relative precision of one rounding: 8 bits of mantissa for bfloat16, 11 for float16.
RTOL = {"float32": 0.0, "bfloat16": 2.0**-8, "float16": 2.0**-11}


@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
def test_push_and_pull_round_trip_within_the_dtype_precision(serve, wire_dtype):
    variables = random_variables({"w": (300, 40), "b": (40,)})
    client = serve(variables, num_shards=2, lr=1.0, wire_dtype=wire_dtype, slice_bytes=16_000)
    _, pulled = client.pull(0, timeout_s=10.0)
    for name, value in variables.items():
        assert pulled[name].dtype == np.float32
        np.testing.assert_allclose(pulled[name], value, rtol=RTOL[wire_dtype], atol=0)

    grads = random_variables({"w": (300, 40), "b": (40,)}, seed=1)
    client.push(0, 0, grads, num_examples=1, loss=0.0)
    _, after = client.pull(1, timeout_s=10.0)
    # The shard applied the gradient as it arrived (rounded once to the wire
    # dtype) in float32; the pull rounds once more.
    wire = WIRE_DTYPES[wire_dtype]
    for name in variables:
        expected = variables[name] - grads[name].astype(wire).astype(np.float32)
        np.testing.assert_allclose(after[name], expected, rtol=RTOL[wire_dtype], atol=1e-6)
    itemsize = wire.itemsize
    assert client.bytes_sent == (300 * 40 + 40) * itemsize
    assert client.bytes_received == 2 * (300 * 40 + 40) * itemsize


def test_bfloat16_gradient_is_accumulated_in_float32_not_rounded_to_bfloat16(serve):
    # 1 + 2**-10 is not a bfloat16 value: if the shard kept bfloat16, the
    # update would vanish.
    client = serve({"w": np.ones(4, np.float32)}, lr=2.0**-10, wire_dtype="bfloat16")
    client.push(0, 0, {"w": np.ones(4, np.float32)}, num_examples=1, loss=0.0)
    client.wire_dtype = np.dtype(np.float32)  # read back exactly
    _, params = client.pull(1, timeout_s=10.0)
    np.testing.assert_array_equal(params["w"], np.full(4, 1 - 2.0**-10, np.float32))
    assert np.float32(1 - 2.0**-10).astype(ml_dtypes.bfloat16) != np.float32(1 - 2.0**-10)


def test_workers_pulling_one_version_in_different_dtypes_each_get_their_own(serve):
    # Sync with 2 workers: the shard encodes a version once per wire dtype
    # and answers every pull of it with those messages.
    variables = random_variables({"w": (300, 40)})
    exact = serve(variables, num_workers=2)
    compact = PSClient(exact.addresses, exact.plan, "bfloat16")
    try:
        for client in (exact, compact, exact, compact):
            _, pulled = client.pull(0, timeout_s=10.0)
            rtol = RTOL["float32" if client is exact else "bfloat16"]
            np.testing.assert_allclose(pulled["w"], variables["w"], rtol=rtol, atol=0)
        grads = random_variables({"w": (300, 40)}, seed=1)
        exact.push(0, 0, grads, num_examples=1, loss=0.0)
        exact.push(1, 0, grads, num_examples=1, loss=0.0)
        version, pulled = exact.pull(1, timeout_s=10.0)
        assert version == 1  # a new version: not the messages of version 0
        np.testing.assert_allclose(pulled["w"], variables["w"] - 0.1 * grads["w"], rtol=1e-6)
    finally:
        compact.close()
