"""The worker's side of the wire: one client for all PS shards.

    client = PSClient(["10.0.0.1:4711", "10.0.0.2:4711"], placement)
    version, params = client.pull(min_version=step, timeout_s=60)
    client.push(worker_rank, step, grads, num_examples, loss)

Every call fans out to all shards at once (one thread per shard), so one
slow shard does not serialise the others. A shard that is UNAVAILABLE
(restarting, not yet listening) is retried with exponential backoff up to
`max_attempts`; a repeated push is safe because shards apply each
(worker_rank, step) once. Other failures surface as towerps errors.
Thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent import futures

import grpc
import numpy as np

from towerps.errors import BadTensor, PullTimeout, ShardUnavailable, StepMismatch
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.wire import GRPC_OPTIONS, push_messages, read_pull

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
_OUTCOMES = {v: k.lower() for k, v in pb.PushReply.Outcome.items()}


class PSClient:
    def __init__(
        self,
        addresses: list[str],
        placement: Mapping[str, int],
        rpc_timeout_s: float = 120.0,
        max_attempts: int = 4,
        backoff_s: float = 0.2,
    ):
        self.addresses = list(addresses)
        self.placement = dict(placement)
        self.rpc_timeout_s = rpc_timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._channels = [grpc.insecure_channel(a, options=GRPC_OPTIONS) for a in addresses]
        self._stubs = [pb_grpc.ParameterServerStub(c) for c in self._channels]
        self._pool = futures.ThreadPoolExecutor(
            max_workers=len(addresses), thread_name_prefix="ps-client"
        )

    @property
    def num_shards(self) -> int:
        return len(self.addresses)

    def pull(self, min_version: int, timeout_s: float) -> tuple[int, dict[str, np.ndarray]]:
        """Block until every shard holds version >= min_version; return the merged
        parameters and the lowest shard version (in sync mode all are equal)."""

        def pull_one(k: int):
            request = pb.PullRequest(min_version=min_version, timeout_s=timeout_s)
            def call():
                # The RPC deadline leaves the shard time to answer DEADLINE_EXCEEDED itself.
                return read_pull(self._stubs[k].Pull(request, timeout=timeout_s + 10.0))

            return self._call(k, call)

        results = self._fan_out(pull_one)
        params: dict[str, np.ndarray] = {}
        for _, tensors in results:
            params.update(tensors)
        return min(v for v, _ in results), params

    def push(
        self,
        worker_rank: int,
        step: int,
        grads: Mapping[str, np.ndarray],
        num_examples: int,
        loss: float,
    ) -> list[str]:
        """Send each shard its slice of `grads`; returns each shard's outcome."""
        unknown = sorted(set(grads) - set(self.placement))
        if unknown:
            raise BadTensor(f"gradients for variables no shard holds: {unknown}")
        parts: list[dict[str, np.ndarray]] = [{} for _ in self.addresses]
        for name, grad in grads.items():
            parts[self.placement[name]][name] = grad

        def push_one(k: int):
            def call(attempt: int):
                header = pb.PushHeader(
                    worker_rank=worker_rank,
                    step=step,
                    attempt=attempt,
                    num_examples=num_examples,
                    loss=loss,
                    num_tensors=len(parts[k]),
                )
                reply = self._stubs[k].Push(
                    push_messages(header, parts[k]), timeout=self.rpc_timeout_s
                )
                return _OUTCOMES[reply.outcome]

            return self._call(k, call, pass_attempt=True)

        return self._fan_out(push_one)

    def status(self, since_version: int = 0) -> list[pb.StatusReply]:
        request = pb.StatusRequest(since_version=since_version)
        return self._fan_out(
            lambda k: self._call(k, lambda: self._stubs[k].Status(request, timeout=30.0))
        )

    def _fan_out(self, fn: Callable[[int], object]) -> list:
        pending = [self._pool.submit(fn, k) for k in range(self.num_shards)]
        return [f.result() for f in pending]

    def _call(self, k: int, call: Callable, pass_attempt: bool = False):
        """Run one RPC against shard k, retrying transient failures."""
        for attempt in range(self.max_attempts):
            try:
                return call(attempt) if pass_attempt else call()
            except grpc.RpcError as err:
                code = err.code()
                if code in _RETRYABLE and attempt + 1 < self.max_attempts:
                    time.sleep(self.backoff_s * 2**attempt)
                    continue
                raise _as_towerps_error(k, self.addresses[k], err) from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_towerps_error(k: int, address: str, err: grpc.RpcError) -> Exception:
    code, details = err.code(), err.details()
    where = f"shard {k} at {address}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadTensor(f"{where} refused the tensors: {details}")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return StepMismatch(f"{where}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PullTimeout(f"{where} did not answer in time: {details}")
    return ShardUnavailable(
        f"{where} failed with {code.name}: {details} "
        "(is the shard's process alive and its address reachable from this node?)"
    )
