import numpy as np
import pytest

from towerps.errors import BadTensor, ConfigError
from towerps.ps.placement import MIN_SLICE_BYTES, plan_placement
from towerps.wire import TENSOR_ALIGNMENT

from ..shapes import CIFAR10_CNN

pytestmark = pytest.mark.unit


def test_local3_is_83_percent_of_the_cifar10_cnn():
    sizes = {n: int(np.prod(s)) * 4 for n, s in CIFAR10_CNN.items()}
    assert sizes["local3/kernel"] == 3_538_944
    assert sizes["local3/kernel"] / sum(sizes.values()) > 0.82


@pytest.mark.parametrize("num_shards", [2, 3, 4, 8])
def test_no_shard_holds_more_than_1_1x_the_mean(num_shards):
    plan = plan_placement(CIFAR10_CNN, num_shards)
    load = plan.shard_bytes()
    assert sum(load) == 4_273_192
    assert max(load) <= 1.1 * np.mean(load)
    # local3 is sliced across several shards
    assert len({s.shard for s in plan.slices if s.variable == "local3/kernel"}) > 1


def test_one_shard_slices_nothing_and_small_variables_stay_whole():
    plan = plan_placement(CIFAR10_CNN, 1)
    assert all(s.whole for s in plan.slices)
    plan4 = plan_placement(CIFAR10_CNN, 4)
    assert all(s.whole for s in plan4.slices if s.variable.endswith("bias"))


def test_split_and_join_round_trip_exactly_and_split_makes_no_copies():
    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in CIFAR10_CNN.items()}
    plan = plan_placement(CIFAR10_CNN, 4)
    per_shard = plan.split(tensors)
    assert [sum(a.nbytes for a in part.values()) for part in per_shard] == plan.shard_bytes()
    for part in per_shard:
        for name, array in part.items():
            variable = name.split(":")[0]
            assert np.shares_memory(array, tensors[variable])
            assert array.flags.c_contiguous
    merged = {name: a for part in per_shard for name, a in part.items()}
    joined = plan.join(merged)
    assert set(joined) == set(tensors)
    for name in tensors:
        np.testing.assert_array_equal(joined[name], tensors[name])

def test_sliced_variables_are_joined_into_memory_tensorflow_can_take_as_it_is():
    """Eight sliced variables: an unaligned join would be aligned by luck
    (numpy aligns to 16 bytes) a quarter of the time, per variable."""
    shapes = {f"v{i}": (1000 + 7 * i, 33) for i in range(8)}
    plan = plan_placement(shapes, 3, slice_bytes=MIN_SLICE_BYTES)
    assert all(sum(s.variable == v for s in plan.slices) > 1 for v in shapes)
    rng = np.random.default_rng(1)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    joined = plan.join({n: a for part in plan.split(tensors) for n, a in part.items()})
    for name, array in joined.items():
        np.testing.assert_array_equal(array, tensors[name])
        assert array.ctypes.data % TENSOR_ALIGNMENT == 0, name


def test_plan_is_deterministic_and_names_its_slices():
    a, b = plan_placement(CIFAR10_CNN, 4), plan_placement(dict(reversed(CIFAR10_CNN.items())), 4)
    assert a == b
    names = [s.name for s in a.slices if s.variable == "local3/kernel"]
    assert sorted(names) == sorted(f"local3/kernel:{i}" for i in range(len(names)))


def test_greedy_by_bytes_balances_whole_variables():
    shapes = {"a": (100,), "b": (60,), "c": (50,), "d": (10,)}
    plan = plan_placement(shapes, 2, itemsize=1, slice_bytes=1000)
    assert {s.name: s.shard for s in plan.slices} == {"a": 0, "b": 1, "c": 1, "d": 0}
    assert plan.shard_bytes() == [110, 110]


def test_bad_counts_and_mismatched_tensors_are_refused():
    with pytest.raises(ConfigError, match="use --num-ps 2 or fewer"):
        plan_placement({"a": (1,), "b": (1,)}, 3)
    with pytest.raises(ConfigError, match="at least 1"):
        plan_placement({"a": (1,)}, 0)
    plan = plan_placement({"a": (2,)}, 1)
    with pytest.raises(BadTensor, match="missing \\['a'\\], unknown \\['z'\\]"):
        plan.split({"z": np.zeros(2, np.float32)})
    with pytest.raises(BadTensor, match="slices missing"):
        plan.join({})
