"""Shard and worker processes keep the memory they free for their next step.

    keep_freed_memory()     # once, before the process's first step

Every sync step a shard makes arrays as large as its variables and frees
them again: the pushed gradients it copies out, the version's read-only
snapshot, the optimizer's temporaries. In a Ray actor's process glibc's
malloc gave those blocks back to the system when they were freed, so each
step touched fresh pages again, each a trap and a zeroed page: about as many
minor page faults a step as the shard's arrays have pages, twice over, where
the same shard in a plain Python process took next to none (glibc raises its
mmap threshold after the first large free there; what keeps it from doing so
in Ray's processes we did not pin down). Setting both thresholds high makes
the process keep freed blocks and reuse them: tests/ray/test_shard_memory.py
counts fewer faults a step than a thirty-second of the pages (or 100),
through shared memory and gRPC.

The thresholds govern the main arena. A gRPC handler thread allocates from
one of glibc's per-thread arenas, whose heaps hold at most 64 MiB each and
are unmapped when they fall empty: a push of a few large variables copied
out in a handler thread took fresh heaps, and fresh pages, at every step
(two variables of 32 MiB and one of 8 MiB through gRPC: ~2,000 page faults
a step, tests/ray/test_shard_memory.py; the transport benchmark's 64 MB
push: ~3,300 by perf's page-fault samples, not kept, half of them
np.isfinite's temporary, which towerps.wire.all_finite no longer makes).
So a shard's process also runs with SHARD_PROCESS_ENV, one arena for all
its threads (`MALLOC_ARENA_MAX=1`):
every block comes from the main heap, under the thresholds above. glibc
reads that limit before the process's second thread allocates, so it must
be in the environment the process starts with (the shard actor's
runtime_env): mallopt(M_ARENA_MAX) in a running Ray worker changes nothing
(measured). One arena means one malloc lock for all the process's
threads, gRPC's C threads included (and TensorFlow's, with a Keras
optimizer); what that lock costs is inside the benchmarks' figures, not
measured apart.

A worker actor's process keeps its freed memory too (one call to
keep_freed_memory, no arena setting): each pull makes arrays as large as
the parameters. Scratch counts, not benchmarks: the transport benchmark's
client, pulling 64 MB over gRPC on its main thread, took ~2,000 page
faults a pull without it, ~2 with it; an actor shaped like the worker
(its methods on two threads, so pulls allocate in per-thread arenas)
pulling 72 MiB from two shards, ~7,000 a step without it and a few hundred
with it. A worker keeps glibc's arenas as they are: TensorFlow's threads
allocate side by side there, and one arena would put them behind one lock.

Limits: glibc 2.34 and older refuse an mmap threshold above 32 MiB, so
there a larger block is still mapped fresh each step. The price: freed
memory stays in the process, so its resident size stays near its peak
between steps instead of falling back (how a long run's peak moves with it
is not measured yet).
"""

from __future__ import annotations

import ctypes

# mallopt(3) parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# A shard process's environment from its start: one malloc arena (see above).
SHARD_PROCESS_ENV = {"MALLOC_ARENA_MAX": "1"}
KEEP_BYTES = 1 << 30  # blocks up to this size come from the heap; this much freed is kept
_OLD_GLIBC_MAX = 32 << 20  # the highest mmap threshold glibc 2.34 and older accept


def keep_freed_memory(limit_bytes: int = KEEP_BYTES) -> bool:
    """Make glibc's malloc serve blocks up to `limit_bytes` (or the most this
    glibc accepts, 32 MiB on older ones) from its heaps and keep up to
    `limit_bytes` of freed memory. Returns whether both took effect: False
    where the C library is not glibc (nothing is changed there) or refused."""
    if not 0 < limit_bytes < 2**31:
        raise ValueError(f"limit_bytes must be between 1 and 2**31 - 1 (a C int), got {limit_bytes}")
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): leave malloc as it is
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mapped = (mallopt(_M_MMAP_THRESHOLD, limit_bytes) == 1
              or mallopt(_M_MMAP_THRESHOLD, min(limit_bytes, _OLD_GLIBC_MAX)) == 1)
    trimmed = mallopt(_M_TRIM_THRESHOLD, limit_bytes) == 1
    return mapped and trimmed
