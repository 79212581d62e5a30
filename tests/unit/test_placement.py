import pytest

from towerps.errors import ConfigError
from towerps.ps.placement import place_variables, shard_bytes

pytestmark = pytest.mark.unit


def test_greedy_by_bytes_balances_and_is_deterministic():
    sizes = {"a": 100, "b": 60, "c": 50, "d": 10}
    placement = place_variables(sizes, 2)
    assert placement == {"a": 0, "b": 1, "c": 1, "d": 0}
    assert shard_bytes(sizes, placement) == [110, 110]
    assert place_variables(dict(reversed(sizes.items())), 2) == placement


def test_every_shard_gets_something_and_bad_counts_are_refused():
    sizes = {"a": 1, "b": 1}
    assert sorted(place_variables(sizes, 2).values()) == [0, 1]
    with pytest.raises(ConfigError, match="use --num-ps 2 or fewer"):
        place_variables(sizes, 3)
    with pytest.raises(ConfigError, match="at least 1"):
        place_variables(sizes, 0)
