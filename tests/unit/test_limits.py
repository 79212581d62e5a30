"""A shard's call caps: the job's reserved slots and everyone else's."""

import pytest

from towerps.errors import ConfigError, Overloaded
from towerps.ps.limits import CALL, OTHER, PUSH, CallSlots, ShardLimits

pytestmark = pytest.mark.unit


def test_other_callers_cannot_take_the_jobs_slots():
    slots = CallSlots(ShardLimits(max_calls=2, max_other_calls=1, max_calls_per_peer=4))
    with slots.admit("ipv4:127.0.0.1", OTHER):
        with pytest.raises(Overloaded, match="not its workers'"):
            with slots.admit("ipv4:127.0.0.2", OTHER):
                pass
        # The others' cap is full; the job's slots are all still free.
        with slots.admit("worker 0"), slots.admit("worker 1", PUSH):
            assert slots.in_flight == 3
            with pytest.raises(Overloaded, match="calls of its job"):
                with slots.admit("job"):
                    pass
    assert slots.in_flight == 0


def test_a_peer_cap_holds_for_each_kind_of_call():
    slots = CallSlots(ShardLimits(max_calls=8, max_other_calls=8, max_calls_per_peer=2))
    with slots.admit("worker 0"), slots.admit("worker 0"):
        with pytest.raises(Overloaded, match="worker 0 has 2 calls in flight"):
            with slots.admit("worker 0"):
                pass
        with slots.admit("worker 1"):
            pass


def test_a_peers_pulls_cannot_take_the_slots_of_its_pushes():
    """Worker 0's pulls and Status calls at their cap (a flood under its own
    credential) leave its pushes their own slots, and the other way round."""
    slots = CallSlots(ShardLimits(max_calls=16, max_calls_per_peer=2))
    with slots.admit("worker 0", CALL), slots.admit("worker 0", CALL):
        with pytest.raises(Overloaded, match="worker 0 has 2 calls in flight"):
            with slots.admit("worker 0", CALL):
                pass
        with slots.admit("worker 0", PUSH), slots.admit("worker 0", PUSH):
            with pytest.raises(Overloaded, match="worker 0 has 2 calls that push"):
                with slots.admit("worker 0", PUSH):
                    pass
            with slots.admit("worker 0", OTHER):  # health, reflection: a kind of their own
                assert slots.in_flight == 5
    assert slots.in_flight == 0


def test_a_peers_waiting_pulls_are_capped_apart():
    slots = CallSlots(ShardLimits(max_waits_per_peer=1))
    with slots.waiting("worker 0"):
        with pytest.raises(Overloaded, match="worker 0 has 1 pulls waiting"):
            with slots.waiting("worker 0"):
                pass
        with slots.waiting("worker 1"):
            pass
    with slots.waiting("worker 0"):  # freed
        pass


@pytest.mark.parametrize("field", ["max_other_calls", "body_s", "max_waits_per_peer"])
def test_the_new_bounds_must_be_positive(field):
    with pytest.raises(ConfigError, match=field):
        ShardLimits(**{field: 0})
