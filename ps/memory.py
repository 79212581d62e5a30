"""A shard process keeps the memory it frees for its next step.

    keep_freed_memory()     # once, before the shard's first step

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

Limits: the gRPC handler threads allocate from glibc's per-thread arenas,
whose heaps hold at most 64 MiB, so a block larger than that (one variable
of a shard's slice above ~64 MiB) is still mapped fresh each step whatever
the threshold; glibc 2.34 and older refuse an mmap threshold above 32 MiB,
so there the limit is 32 MiB. The price: freed memory stays in the process,
so its resident size stays near its peak between steps instead of falling
back (how a long run's peak moves with it is not measured yet).
"""

from __future__ import annotations

import ctypes

# mallopt(3) parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
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
