"""The watch loop's policy (cluster/recovery/policy.py), without Ray: what each
finding of a poll leads to, with a supervisor (the job takes checkpoints)
and without one."""

import pytest

from towerps.cluster.recovery.policy import Action, Event, RecoveryPolicy, Status
from towerps.errors import ActorDied, ActorFailed, ShardUnavailable

pytestmark = pytest.mark.unit

RECOVERS, FAILS = RecoveryPolicy(recovers=True), RecoveryPolicy(recovers=False)


def test_with_a_supervisor_deaths_and_failed_shards_are_recovered():
    died = RECOVERS.decide(Status(Event.WORKERS_DIED, (2, 0), ActorDied("gone")))
    assert (died.action, died.ranks, died.error) == (Action.REPLACE_WORKERS, (2, 0), None)
    shards = RECOVERS.decide(Status(Event.SHARDS_FAILED, error=ShardUnavailable("refused")))
    assert shards.action is Action.RECOVER_SHARDS
    behind = RECOVERS.decide(Status(Event.RUNS_BEHIND, (1,)))
    assert (behind.action, behind.ranks) == (Action.RUN_AGAIN, (1,))


def test_a_workers_own_error_fails_the_run_even_with_a_supervisor():
    error = ActorFailed("WorkerActor.run raised ValueError: bad batch")
    for policy in (RECOVERS, FAILS):
        decision = policy.decide(Status(Event.WORKER_FAILED, (1,), error))
        assert (decision.action, decision.ranks, decision.error) == (Action.FAIL, (1,), error)


def test_without_a_supervisor_a_death_fails_the_run_with_what_reported_it():
    reported = ActorDied("an actor of this job died")
    decision = FAILS.decide(Status(Event.WORKERS_DIED, (1,), reported))
    assert (decision.action, decision.ranks, decision.error) == (Action.FAIL, (1,), reported)
    refused = ShardUnavailable("shard 1 refused the connection")
    assert FAILS.decide(Status(Event.SHARDS_FAILED, error=refused)).error is refused


def test_a_worker_the_heartbeat_killed_fails_a_run_without_checkpoints_with_the_fix():
    decision = FAILS.decide(Status(Event.WORKERS_DIED, (2,)))  # no report from Ray
    assert decision.action is Action.FAIL and isinstance(decision.error, ActorDied)
    assert "worker 2 stopped answering" in str(decision.error)
    assert "--checkpoint-every" in str(decision.error)


@pytest.mark.parametrize("policy", [RECOVERS, FAILS], ids=["recovers", "fails"])
def test_progress_the_end_and_a_stop_are_the_same_with_or_without_a_supervisor(policy):
    replies = ["reply of shard 0"]
    assert policy.decide(Status(Event.PROGRESSING, replies=replies)).action is Action.GO_ON
    assert policy.decide(Status(Event.FINISHED, replies=replies)).action is Action.FINISH
    for event in (Event.BUDGET_SPENT, Event.STOP_REQUESTED):
        assert policy.decide(Status(event, replies=replies)).action is Action.END_RUN
