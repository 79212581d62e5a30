"""A shard process keeps the memory it frees for its next step.

    keep_freed_memory()     # once, first thing in the shard's process

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
counts fewer faults a step than a quarter of the pages, through shared
memory and gRPC.

The price: the process's resident memory stays near its peak instead of
falling back between steps (the peak itself does not change). Only the
shard's own process is set so: by its Ray actor, and by the benchmarks'
shard processes.
"""

from __future__ import annotations

import ctypes

# mallopt(3) parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 30  # blocks up to this size come from the heap; this much freed is kept


def keep_freed_memory(limit_bytes: int = KEEP_BYTES) -> bool:
    """Make glibc's malloc serve blocks up to `limit_bytes` from its heaps and
    keep up to that much freed memory. Returns whether it took effect: False
    where the C library is not glibc (nothing is changed there)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): leave malloc as it is
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return (mallopt(_M_MMAP_THRESHOLD, limit_bytes) == 1
            and mallopt(_M_TRIM_THRESHOLD, limit_bytes) == 1)
