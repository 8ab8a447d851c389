"""glibc's allocator, tuned for passes and handed back after a burst (no torch here: the server calls it).

A pass allocates many activations over glibc's mmap threshold (128 KB, rising to at most 32 MB), each served with
new pages from the kernel that fault and are zeroed on first touch. Raising the threshold to 32 MB and keeping up
to KEEP_FREED of freed memory in the heap for the next pass (`tune`; the same as MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_ in the environment) took a measurable share off the SemIf request in bf16
(docs/measurements/cpu-precision.md). But each thread that allocates gets an arena of its own, each keeps what it
freed, and a served process's resident memory grew by 1.4 GB over 1,000 requests and stayed there. So when the
server's queue has been empty for a second after a burst, `hand_back` returns every arena's free memory to the
system (malloc_trim): the next burst's first pass pays the page faults again, a busy server never does
(docs/measurements/serving-under-load.md#memory).
"""

from __future__ import annotations

import ctypes
import functools

KEEP_FREED = 256 << 20  # a 21-question pass's activations on the 1.5B fit in it


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc
        return None


@functools.cache
def tune() -> bool:
    """Serve allocations up to 32 MB from the heap and keep up to KEEP_FREED bytes freed there; process-wide,
    once, only where the C library is glibc. Whether it was applied."""
    libc = _libc()
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(libc and libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) and libc.mallopt(M_TRIM_THRESHOLD, KEEP_FREED))


def hand_back() -> bool:
    """Return the free memory of every arena to the system (glibc's malloc_trim(0)). Whether any was."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(0))
