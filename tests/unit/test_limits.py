"""A shard's call caps: the job's reserved slots and everyone else's."""

import pytest

from towerps.errors import ConfigError, Overloaded
from towerps.ps.limits import CallSlots, ShardLimits

pytestmark = pytest.mark.unit


def test_other_callers_cannot_take_the_jobs_slots():
    slots = CallSlots(ShardLimits(max_calls=2, max_other_calls=1, max_calls_per_peer=4))
    with slots.admit("ipv4:127.0.0.1", reserved=False):
        with pytest.raises(Overloaded, match="not its workers'"):
            with slots.admit("ipv4:127.0.0.2", reserved=False):
                pass
        # The others' cap is full; the job's slots are all still free.
        with slots.admit("worker 0"), slots.admit("worker 1"):
            assert slots.in_flight == 3
            with pytest.raises(Overloaded, match="calls of its job"):
                with slots.admit("job"):
                    pass
    assert slots.in_flight == 0


def test_a_peer_cap_holds_across_both_classes():
    slots = CallSlots(ShardLimits(max_calls=8, max_other_calls=8, max_calls_per_peer=2))
    with slots.admit("worker 0"), slots.admit("worker 0", reserved=False):
        with pytest.raises(Overloaded, match="worker 0 has 2 calls"):
            with slots.admit("worker 0"):
                pass
        with slots.admit("worker 1", reserved=False):
            pass


@pytest.mark.parametrize("field", ["max_other_calls", "body_s"])
def test_the_new_bounds_must_be_positive(field):
    with pytest.raises(ConfigError, match=field):
        ShardLimits(**{field: 0})
