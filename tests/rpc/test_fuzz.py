"""Property-based fuzzing of a live shard process with valid credentials
(the cases of benchmarks/fuzz.py; the benchmark runs 10,000).

Every case: a status code a client may branch on (never UNKNOWN or
INTERNAL), no call past its deadline but a pull waiting for a version (a
SharedPushPull's DEADLINE_EXCEEDED must be the shard's own answer), the
shard alive, the parameters' checksum unchanged. Afterwards: no call left in
flight, the shard idle, its resident memory within 50 MB of the start."""

import pytest

from benchmarks import fuzz

pytestmark = [pytest.mark.rpc, pytest.mark.slow]

CASES = 1000


@pytest.fixture(scope="module")
def shard():
    process = fuzz.ShardProcess()
    yield process
    process.close()


def test_a_thousand_hostile_calls_leave_the_shard_as_it_was(shard):
    checksum = shard.checksum()
    rss_before = shard.rss_bytes()
    codes = fuzz.fuzz(shard, CASES)
    assert sum(codes.values()) == CASES
    assert codes.get("INVALID_ARGUMENT", 0) > CASES // 4  # the cases did reach the checks
    settled = fuzz.settle(shard)
    assert settled["calls_in_flight_besides_status"] == 0
    assert settled["quiet_cpu_s"] < 0.5 * settled["quiet_s"]  # no thread left spinning
    assert shard.rss_bytes() - rss_before < fuzz.RSS_SLACK_BYTES
    assert shard.checksum() == checksum
