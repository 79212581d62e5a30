"""Which shared memory moves a tensor's bytes between two processes of one node fastest.

    .venv/bin/python benchmarks/same_node.py          # 4 and 64 MB -> results/same_node.json
    .venv/bin/python benchmarks/same_node.py --tiny   # seconds

The choice behind towerps' same-node transport (docs/design.md). A sender
process (this one) hands N bytes of float32 to a receiver (a Ray actor on
the same node), which must end up holding its own copy: a shard checks
what it copied, never bytes another process can still change. Per
mechanism, the sender's and the receiver's seconds are measured in each
process and added (how the receiver learns of the bytes is left out: in
towerps that is the gRPC call the bytes' description rides on anyway):

  file     pwritev of the arrays into a file in /dev/shm, preadv into the
           receiver's buffer (what towerps uses: no mapping, so a file the
           sender truncates gives a short read, not a SIGBUS);
  mmap     multiprocessing.shared_memory: copy into the mapping, copy out;
  object   ray.put of the arrays, ray.get in the receiver (a read-only view
           of the object store) and a copy, then the reference released;
  object0  the same without the receiver's copy (what a receiver that may
           trust the store's immutability would pay).

Rounds take the mechanisms in turn, so load from other processes falls on
each alike; figures are medians, and MB/s of the sum of both sides.
"""

from __future__ import annotations

import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import ray

from benchmarks import _common as common

MECHANISMS = ("file", "mmap", "object", "object0")


def add_flags(parser) -> None:
    parser.add_argument("--sizes-mb", default="4,64", help="comma-separated sizes in MB")
    parser.add_argument("--reps", type=int, default=15, help="rounds per size")


@ray.remote
class Receiver:
    """Takes bytes by each mechanism; returns its own seconds."""

    def file(self, path: str, nbytes: int) -> float:
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            buf = np.empty(nbytes, np.uint8)
            assert os.preadv(fd, [buf], 0) == nbytes
        finally:
            os.close(fd)
        return time.perf_counter() - t0

    def mmap(self, name: str, nbytes: int) -> float:
        from multiprocessing import resource_tracker, shared_memory

        t0 = time.perf_counter()
        segment = shared_memory.SharedMemory(name)
        buf = np.frombuffer(segment.buf, np.uint8, nbytes).copy()
        del buf
        segment.close()
        resource_tracker.unregister(segment._name, "shared_memory")  # the sender owns it
        return time.perf_counter() - t0

    def object(self, refs: list, copy: bool = True) -> float:
        t0 = time.perf_counter()
        arrays = ray.get(refs[0])
        if copy:
            arrays = [a.copy() for a in arrays]
        del arrays
        return time.perf_counter() - t0


def one_round(receiver, arrays: list[np.ndarray], nbytes: int, path: str, segment) -> dict:
    """Seconds (sender + receiver) of each mechanism, in turn."""
    out = {}
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY)
    os.pwritev(fd, arrays, 0)
    os.close(fd)
    send = time.perf_counter() - t0
    out["file"] = send + ray.get(receiver.file.remote(path, nbytes))

    t0 = time.perf_counter()
    view, at = np.frombuffer(segment.buf, np.uint8, nbytes), 0
    for a in arrays:
        view[at:at + a.nbytes] = a.view(np.uint8).reshape(-1)
        at += a.nbytes
    del view
    send = time.perf_counter() - t0
    out["mmap"] = send + ray.get(receiver.mmap.remote(segment.name, nbytes))

    for name, copy in (("object", True), ("object0", False)):
        t0 = time.perf_counter()
        ref = ray.put(arrays)
        send = time.perf_counter() - t0
        out[name] = send + ray.get(receiver.object.remote([ref], copy))
        del ref
    return out


def measure(receiver, size_mb: int, reps: int, budget) -> dict:
    from multiprocessing import shared_memory

    nbytes = size_mb * 10**6 // 4 * 4
    # A model's worth of tensors: one large and a few small, as a push carries.
    big = np.random.default_rng(0).standard_normal(nbytes // 4 - 3 * 1024).astype(np.float32)
    arrays = [big] + [np.ones(1024, np.float32) for _ in range(3)]
    path = f"/dev/shm/towerps-bench-{os.getpid()}"
    with open(path, "wb") as f:
        f.truncate(nbytes)
    segment = shared_memory.SharedMemory(create=True, size=nbytes)
    seconds = {m: [] for m in MECHANISMS}
    try:
        one_round(receiver, arrays, nbytes, path, segment)  # warm-up: pages, actor
        for _ in range(reps):
            if not budget.allows(0):
                break
            for m, s in one_round(receiver, arrays, nbytes, path, segment).items():
                seconds[m].append(s)
    finally:
        os.unlink(path)
        segment.close()
        segment.unlink()
    return {m: {"median_s": common.median(s), "mb_per_s": nbytes / 1e6 / common.median(s),
                "rounds": len(s)} for m, s in seconds.items()}


def main(argv=None) -> dict:
    args = common.parse_args("same_node", __doc__, argv, add_flags)
    if args.tiny:
        args.sizes_mb, args.reps = "1", 3
    sizes = [int(s) for s in args.sizes_mb.split(",") if s]
    budget = common.Budget(args.budget_s)
    with common.local_ray(num_cpus=2):
        receiver = Receiver.remote()
        per_size = {f"{s}MB": measure(receiver, s, args.reps, budget) for s in sizes}
    best = {size: max(MECHANISMS, key=lambda m: fig[m]["mb_per_s"])
            for size, fig in per_size.items()}
    line = "; ".join(
        f"{size} " + " / ".join(f"{m} {fig[m]['mb_per_s']:,.0f}" for m in MECHANISMS) + " MB/s"
        for size, fig in per_size.items())
    return common.write_result(
        args, inputs={"sizes_mb": sizes, "reps": args.reps}, budget=budget,
        figures={"per_size": per_size, "fastest": best},
        summary=f"sender + receiver, medians: {line}",
        notes=["MB = 10^6 bytes; seconds are the sender's copy in plus the receiver's copy "
               "out, each timed in its own process; the signal between them is not counted."])


if __name__ == "__main__":
    main()
