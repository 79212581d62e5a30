"""Bounds on what one caller can make a shard do: waits, calls, idle streams.

    limits = ShardLimits()                 # the defaults a job's shards use
    wait_s = checked_wait(request.timeout_s, limits.max_wait_s)   # BadRequest on NaN/negative
    slots = CallSlots(limits)
    with slots.admit("worker 3", PUSH):    # Overloaded beyond the caps
        ...
    with slots.admit("worker 3", CALL), slots.waiting("worker 3"):   # a pull that waits
        ...
    with slots.admit("ipv4:127.0.0.1", OTHER):   # health, reflection, tools
        ...
    watch = IdleWatch(limits.idle_stream_s)
    stream = watch.track(cancel=context.cancel)
    stream.peer_turn(); ...; stream.our_turn(); ...; stream.done()

Every wait a caller can ask for is clamped to `max_wait_s`. The job's own
calls (its workers' and its driver's, to ParameterServer) hold one of
`max_calls` slots on their shard, reserved for them; every other call
(health, reflection, a tool's Status) one of `max_other_calls`, so that
callers outside the job can never take the workers' slots or threads.

Each call also holds one of `max_calls_per_peer` slots of its peer (an
authenticated principal, or the caller's host) and its kind: PUSH, a call
that carries a push (Push, PushPull and their Shared* forms: a worker's
step); CALL, the job's other calls (Pull, SharedPull, Status); OTHER, a
call outside the job's. A peer's kinds are capped apart, so a flood under
a worker's own credential of pulls or Status calls cannot take the slots
its step needs. A pull that waits for a version not there yet holds one of
its peer's `max_waits_per_peer` as well, so waiting pulls leave the rest of
the CALL slots to pulls that answer at once. (The peer cannot be the
connection: on a Unix socket, where a local job's shards listen, gRPC
names every connection's peer "unix:".)

A request body that does not come within `body_s` ends its call
(ps/guard.py), and a stream whose peer moves no bytes for `idle_stream_s`
is cancelled by the watch, which frees its thread. Plain Python: the
servicer passes gRPC's `context.cancel` in. The caps are stage 2 of a
call's checks, a pull's wait stage 5 (ps/pipeline.py has them all).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from towerps.errors import BadRequest, ConfigError, Overloaded


@dataclass(frozen=True)
class ShardLimits:
    max_wait_s: float = 3600.0  # longest pull or ssp-gate wait a caller may ask for
    max_calls: int = 64  # the job's calls in flight on one shard (workers', the driver's)
    max_calls_per_peer: int = 8  # ... from one peer, of one kind (PUSH, CALL, OTHER)
    idle_stream_s: float = 60.0  # a stream whose peer sends or reads nothing this long ends
    max_other_calls: int = 8  # every other call in flight: health, reflection, tools
    body_s: float = 10.0  # such a call whose request does not come this long ends
    max_waits_per_peer: int = 4  # pulls of one peer waiting for a version not there yet

    def __post_init__(self):
        for name in ("max_wait_s", "idle_stream_s", "body_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"ShardLimits.{name} must be a positive number, got {value}")
        if min(self.max_calls, self.max_calls_per_peer, self.max_other_calls,
               self.max_waits_per_peer) < 1:
            raise ConfigError(
                f"ShardLimits caps must be at least 1, got max_calls={self.max_calls}, "
                f"max_calls_per_peer={self.max_calls_per_peer}, "
                f"max_other_calls={self.max_other_calls}, "
                f"max_waits_per_peer={self.max_waits_per_peer}"
            )

    @property
    def max_threads(self) -> int:
        """Threads a shard's server needs: one per call of either class in
        flight, and a few more that answer refusals while every slot is taken."""
        return self.max_calls + self.max_other_calls + 8

    def for_workers(self, num_workers: int) -> ShardLimits:
        """Room for every worker's push and pull, plus the driver's and probes' calls."""
        return replace(self, max_calls=max(self.max_calls, 4 * num_workers + 8))


def checked_wait(timeout_s: float, max_wait_s: float) -> float:
    """A caller's timeout as a wait: NaN or negative raise BadRequest, above
    `max_wait_s` (infinity included) is clamped to it."""
    if math.isnan(timeout_s) or timeout_s < 0:
        raise BadRequest(
            f"timeout_s {timeout_s} must be a number of seconds, 0 or more "
            f"(at most {max_wait_s:g} is used)"
        )
    return min(timeout_s, max_wait_s)


PUSH, CALL, OTHER = "push", "call", "other"  # a call's kind, for its peer's caps
_KINDS = {PUSH: "calls that push", CALL: "calls", OTHER: "calls outside the job's"}


class CallSlots:
    """Counts calls in flight, per class (the job's reserved slots, and the
    others'), per peer and kind, and the pulls of each peer that wait.
    Thread-safe."""

    def __init__(self, limits: ShardLimits):
        self._limits = limits
        self._lock = threading.Lock()
        self._total = 0  # the job's calls
        self._others = 0  # everyone else's
        self._per_peer: Counter[tuple[str, str]] = Counter()  # (peer, kind)
        self._waits: Counter[str] = Counter()

    @contextmanager
    def admit(self, peer: str, kind: str = CALL) -> Iterator[None]:
        """Hold one slot for the body: of the job's reserved slots (PUSH,
        CALL) or of the others' (OTHER), and of `peer`'s for `kind`;
        Overloaded (nothing held) beyond a cap."""
        limits, reserved, key = self._limits, kind != OTHER, (peer, kind)
        with self._lock:
            if reserved and self._total >= limits.max_calls:
                raise Overloaded(
                    f"the shard has {self._total} calls of its job in flight, its cap is "
                    f"{limits.max_calls}; retry later"
                )
            if not reserved and self._others >= limits.max_other_calls:
                raise Overloaded(
                    f"the shard has {self._others} calls in flight that are not its "
                    f"workers', its cap for those is {limits.max_other_calls}; retry later"
                )
            if self._per_peer[key] >= limits.max_calls_per_peer:
                raise Overloaded(
                    f"{peer} has {self._per_peer[key]} {_KINDS[kind]} in flight on this "
                    f"shard, the cap per peer is {limits.max_calls_per_peer}; finish or "
                    "cancel some"
                )
            self._count(reserved, 1)
            self._per_peer[key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._count(reserved, -1)
                self._per_peer[key] -= 1
                if not self._per_peer[key]:
                    del self._per_peer[key]

    @contextmanager
    def waiting(self, peer: str) -> Iterator[None]:
        """Hold one of `peer`'s waits (a pull whose version is not there
        yet) for the body; Overloaded (nothing held) beyond the cap."""
        limit = self._limits.max_waits_per_peer
        with self._lock:
            if self._waits[peer] >= limit:
                raise Overloaded(
                    f"{peer} has {self._waits[peer]} pulls waiting for a version on this "
                    f"shard, the cap per peer is {limit}; finish or cancel some"
                )
            self._waits[peer] += 1
        try:
            yield
        finally:
            with self._lock:
                self._waits[peer] -= 1
                if not self._waits[peer]:
                    del self._waits[peer]

    def _count(self, reserved: bool, change: int) -> None:
        if reserved:
            self._total += change
        else:
            self._others += change

    @property
    def in_flight(self) -> int:
        """Calls in flight of both classes."""
        with self._lock:
            return self._total + self._others


class _Stream:
    """One tracked stream. `peer_turn` while we wait for the peer's bytes
    (or for it to read ours), `our_turn` while the shard works or waits on
    its own account (a pull waiting for its version is not idle)."""

    def __init__(self, watch: IdleWatch, cancel: Callable[[], None]):
        self._watch, self.cancel = watch, cancel
        self.since = time.monotonic()
        self.waiting_on_peer = False

    def peer_turn(self) -> None:
        self.since, self.waiting_on_peer = time.monotonic(), True

    def our_turn(self) -> None:
        self.waiting_on_peer = False

    def done(self) -> None:
        self._watch._forget(self)


class IdleWatch:
    """Cancels streams idle on their peer's side. Its thread runs while any
    stream is tracked, so a stopped server leaves no thread behind."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._streams: set[_Stream] = set()
        self._running = False

    def track(self, cancel: Callable[[], None]) -> _Stream:
        stream = _Stream(self, cancel)
        with self._lock:
            self._streams.add(stream)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="idle-watch", daemon=True).start()
        return stream

    def _forget(self, stream: _Stream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def _run(self) -> None:
        # Checking a few times per idle period bounds the overshoot to a fraction of it.
        tick = threading.Event()
        while True:
            tick.wait(min(1.0, self.idle_s / 4))
            now = time.monotonic()
            with self._lock:
                idle = [s for s in self._streams
                        if s.waiting_on_peer and now - s.since > self.idle_s]
                self._streams.difference_update(idle)
                done = not self._streams
                if done:
                    self._running = False
            for stream in idle:
                stream.cancel()
            if done:
                return
