"""Bounds on what one caller can make a shard do: waits, calls, idle streams.

    limits = ShardLimits()                 # the defaults a job's shards use
    wait_s = checked_wait(request.timeout_s, limits.max_wait_s)   # BadRequest on NaN/negative
    slots = CallSlots(limits)
    with slots.admit(peer="worker 3"):     # Overloaded beyond the caps
        ...
    watch = IdleWatch(limits.idle_stream_s)
    stream = watch.track(cancel=context.cancel)
    stream.peer_turn(); ...; stream.our_turn(); ...; stream.done()

Every wait a caller can ask for is clamped to `max_wait_s`; every call holds
one of `max_calls` slots on its shard and one of `max_calls_per_peer` slots
of its peer (an authenticated principal, or the caller's host), so no peer
can take the server's threads; a stream whose peer moves no bytes for
`idle_stream_s` is cancelled by the watch, which frees its thread. Plain
Python: the servicer passes gRPC's `context.cancel` in. The caps are stage
2 of a call's checks, a pull's wait stage 5 (ps/pipeline.py has them all).
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
    max_calls: int = 64  # calls in flight on one shard
    max_calls_per_peer: int = 8  # ... from one peer (a worker holds a push and a pull)
    idle_stream_s: float = 60.0  # a stream whose peer sends or reads nothing this long ends

    def __post_init__(self):
        for name in ("max_wait_s", "idle_stream_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"ShardLimits.{name} must be a positive number, got {value}")
        if self.max_calls < 1 or self.max_calls_per_peer < 1:
            raise ConfigError(
                f"ShardLimits caps must be at least 1, got max_calls={self.max_calls}, "
                f"max_calls_per_peer={self.max_calls_per_peer}"
            )

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


class CallSlots:
    """Counts calls in flight, per shard and per peer. Thread-safe."""

    def __init__(self, limits: ShardLimits):
        self._limits = limits
        self._lock = threading.Lock()
        self._total = 0
        self._per_peer: Counter[str] = Counter()

    @contextmanager
    def admit(self, peer: str) -> Iterator[None]:
        """Hold one slot for the body; Overloaded (nothing held) beyond a cap."""
        limits = self._limits
        with self._lock:
            if self._total >= limits.max_calls:
                raise Overloaded(
                    f"the shard has {self._total} calls in flight, its cap is "
                    f"{limits.max_calls}; retry later"
                )
            if self._per_peer[peer] >= limits.max_calls_per_peer:
                raise Overloaded(
                    f"{peer} has {self._per_peer[peer]} calls in flight on this shard, "
                    f"the cap per peer is {limits.max_calls_per_peer}; finish or cancel some"
                )
            self._total += 1
            self._per_peer[peer] += 1
        try:
            yield
        finally:
            with self._lock:
                self._total -= 1
                self._per_peer[peer] -= 1
                if not self._per_peer[peer]:
                    del self._per_peer[peer]

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._total


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
