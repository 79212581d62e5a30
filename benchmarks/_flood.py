"""A half-open call flood against one gRPC server: calls that send their
headers and never a request body, as a caller who wants to hold a shard's
threads would make them. Loopback only.

    flood = HalfOpenFlood("127.0.0.1:4711", HALF_OPEN_METHODS, threads=4, calls_per_thread=20)
    flood.start()
    flood.ended.wait(30)          # set once `until_ended` calls have ended
    ...the job's calls meanwhile...
    codes = flood.stop()          # no new calls; waits for the open ones to end: {code: count}

Each thread keeps `calls_per_thread` calls open at once, over the methods
in turn, and opens another as soon as one ends, until `stop`. A call's
request stream blocks until the call has ended, so it sends the headers
(with `metadata`: credentials, or none) and never a message, whatever the
method's shape (a unary method's server sees a call whose body has not
come). No call has a deadline: a call ends only when the server ends it.
`stop` waits up to `wait_s` for the open calls to end; one still open then
counts as "OPEN" and is cancelled.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

import grpc

# Every method of a shard's server: the standard services' and towerps' own.
HALF_OPEN_METHODS = (
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/towerps.v1.ParameterServer/Status",
    "/towerps.v1.ParameterServer/Push",
    "/towerps.v1.ParameterServer/Pull",
    "/towerps.v1.ParameterServer/PushPull",
    "/towerps.v1.ParameterServer/SharedPush",
    "/towerps.v1.ParameterServer/SharedPull",
    "/towerps.v1.ParameterServer/SharedPushPull",
)


class HalfOpenFlood:
    def __init__(self, address: str, methods: Sequence[str], threads: int = 4,
                 calls_per_thread: int = 20, metadata=None, until_ended: int = 100):
        if not address.startswith(("127.", "localhost:", "unix:")):
            raise ValueError(f"a flood goes to loopback or a Unix socket only, not {address}")
        self._channel = grpc.insecure_channel(address)
        self._calls = [self._channel.stream_unary(m) for m in methods]
        self._threads = [threading.Thread(target=self._run, args=(t,), daemon=True,
                                          name=f"flood-{t}") for t in range(threads)]
        self._per_thread = calls_per_thread
        self._metadata = metadata
        self._until_ended = until_ended
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._open: set[grpc.Future] = set()
        self.codes: Counter[str] = Counter()
        self.details: dict[str, str] = {}  # one message per code, the first
        self.opened = 0
        self.ended = threading.Event()  # set once `until_ended` calls have ended

    def start(self) -> HalfOpenFlood:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, index: int) -> None:
        slots = threading.Semaphore(self._per_thread)
        turn = index
        while not self._stopping.is_set():
            if not slots.acquire(timeout=0.5):
                continue
            if self._stopping.is_set():
                return
            self._open_one(self._calls[turn % len(self._calls)], slots)
            turn += 1

    def _open_one(self, call, slots: threading.Semaphore) -> None:
        over = threading.Event()

        def headers_only():
            over.wait()  # the stream sends no message while the call lasts
            return
            yield

        future = call.future(headers_only(), metadata=self._metadata)
        with self._lock:
            self._open.add(future)
            self.opened += 1

        def on_end(done: grpc.Future) -> None:
            over.set()
            with self._lock:
                self._open.discard(done)
                self.codes[done.code().name] += 1
                self.details.setdefault(done.code().name, done.details())
                if sum(self.codes.values()) >= self._until_ended:
                    self.ended.set()
            slots.release()

        future.add_done_callback(on_end)

    def stop(self, wait_s: float = 30.0) -> Counter[str]:
        """Open no more calls, wait up to `wait_s` for the open ones to end
        by themselves, cancel any left ("OPEN"); the codes calls ended with."""
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        all_ended = threading.Event()
        with self._lock:
            left = set(self._open)
        if left:
            lock = threading.Lock()

            def one_ended(done):
                with lock:
                    left.discard(done)
                    if not left:
                        all_ended.set()

            for future in list(left):
                future.add_done_callback(one_ended)
            all_ended.wait(wait_s)
        with self._lock:
            still_open = set(self._open)
            codes = Counter(self.codes)
        if still_open:
            codes["OPEN"] = len(still_open)
        for future in still_open:
            future.cancel()
        self._channel.close()
        return codes
