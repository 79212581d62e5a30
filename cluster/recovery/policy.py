"""What the watch loop found, and what to do about it. Pure.

    status = Status(Event.WORKERS_DIED, ranks=(1,), error=err)  # the loop's poll
    decision = RecoveryPolicy(recovers=True).decide(status)
    # Decision(Action.REPLACE_WORKERS, ranks=(1,)): the supervisor's to carry out

Each pass of the watch loop (cluster/run/monitor.py) polls the workers'
`run` calls and shard 0 once and reports one Status, the first of these
that holds, in this order:

    WORKER_FAILED   a worker's run raised an error of its own (the user's
                    model, a bad batch): never recovered, the run fails
    WORKERS_DIED    workers' actors died (Ray said so, or the heartbeat
                    judged them dead and killed them: cluster/recovery/liveness.py)
    RUNS_BEHIND     workers whose runs had ended before the latest rollback,
                    which the steps made again need
    SHARDS_FAILED   the status call to the shards failed
    FINISHED        every run has ended and shard 0 answered
    STOP_REQUESTED  a signal asked the run to stop (reported once)
    BUDGET_SPENT    the time budget is spent (reported once)
    PROGRESSING     none of those: the shards answered, workers still run

The policy maps a status to a Decision. A job that takes checkpoints has
a supervisor and recovers: dead workers are replaced, failed shards are
brought back, ended runs run again. A job without one fails on the first
death with the error that reported it. Like Ray Train's FailurePolicy, the
policy decides and does nothing: the loop and the supervisor act.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from towerps.errors import ActorDied


class Event(enum.Enum):
    """What a poll of the run found (see the module's docstring for the order)."""

    WORKER_FAILED = "worker failed"
    WORKERS_DIED = "workers died"
    RUNS_BEHIND = "runs behind"
    SHARDS_FAILED = "shards failed"
    FINISHED = "finished"
    STOP_REQUESTED = "stop requested"
    BUDGET_SPENT = "budget spent"
    PROGRESSING = "progressing"


@dataclass(frozen=True)
class Status:
    """One poll's finding."""

    event: Event
    ranks: tuple[int, ...] = ()  # the workers it is about (died, failed, behind)
    error: BaseException | None = None  # what reported the failure, if anything did
    replies: list | None = None  # every shard's StatusReply, when the shards answered


class Action(enum.Enum):
    GO_ON = "go on"  # count the updates and keep watching
    END_RUN = "end run"  # tell the shards to end at their next version, then go on
    FINISH = "finish"  # count the last updates and stop watching
    REPLACE_WORKERS = "replace workers"  # the supervisor: Supervisor.recover
    RUN_AGAIN = "run again"  # the supervisor: from the latest rollback's version
    RECOVER_SHARDS = "recover shards"  # the supervisor: dead shards from a checkpoint
    FAIL = "fail"  # raise `error`


RECOVERING = (Action.REPLACE_WORKERS, Action.RUN_AGAIN, Action.RECOVER_SHARDS)


@dataclass(frozen=True)
class Decision:
    action: Action
    ranks: tuple[int, ...] = ()  # the workers it acts on
    error: BaseException | None = None  # what FAIL raises


@dataclass(frozen=True)
class RecoveryPolicy:
    """Maps a Status to a Decision. `recovers`: the job has a supervisor
    (it takes checkpoints to go back to)."""

    recovers: bool

    def decide(self, status: Status) -> Decision:
        event, ranks = status.event, status.ranks
        if event is Event.WORKER_FAILED:
            return Decision(Action.FAIL, ranks, status.error)
        if event is Event.WORKERS_DIED:
            if self.recovers:
                return Decision(Action.REPLACE_WORKERS, ranks)
            return Decision(Action.FAIL, ranks, status.error or ActorDied(
                f"worker {ranks[0]} stopped answering and its actor was killed; the job "
                "takes no checkpoints to recover from (--checkpoint-every N)"))
        if event is Event.RUNS_BEHIND:
            return Decision(Action.RUN_AGAIN, ranks)
        if event is Event.SHARDS_FAILED:
            if self.recovers:
                return Decision(Action.RECOVER_SHARDS)
            return Decision(Action.FAIL, error=status.error)
        if event is Event.FINISHED:
            return Decision(Action.FINISH)
        if event in (Event.STOP_REQUESTED, Event.BUDGET_SPENT):
            return Decision(Action.END_RUN)
        return Decision(Action.GO_ON)
