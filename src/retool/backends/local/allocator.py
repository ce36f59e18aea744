"""Keep glibc from hoarding freed tensor memory on CPU.

glibc's ``malloc`` serves large blocks with ``mmap`` but raises that threshold
every time such a block is freed, so after the first few training steps big
tensors come from the heap, which fragments and never shrinks: on this
machine one LoRA ``forward_backward`` over 8 x 512 tokens peaked at 4.7 GB of
RSS with the default and 1.4 GB with a fixed 1 MiB threshold, at the same
speed. Setting the threshold explicitly (``mallopt(M_MMAP_THRESHOLD)``, the
same as ``MALLOC_MMAP_THRESHOLD_=1048576`` in the environment) turns the
adjustment off for the whole process. A no-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20
_done = False


def release_large_blocks_to_os() -> bool:
    """Serve every allocation of 1 MiB or more with ``mmap``; True if applied."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _done = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
    return _done
