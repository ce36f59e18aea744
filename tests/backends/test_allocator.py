"""``allocator.py``: the fixed mmap threshold, and handing freed heap pages back.

Each check runs in a fresh interpreter, so the RSS it reads is its own and no
other test's allocations move it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from retool.backends.local.allocator import release_free_memory, release_large_blocks_to_os

def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

assert release_large_blocks_to_os()  # 1 MiB threshold: 64 KiB blocks come from the heap
blocks = [bytearray(64 * 1024) for _ in range(4000)]  # 250 MiB, every page touched
del blocks[::2]  # 125 MiB freed in holes between live blocks: no trim at free reaches them
before = rss_mb()
released = release_free_memory()
after = rss_mb()
print(f"{before:.0f} {after:.0f} {released}")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_freed_heap_pages_go_back_to_the_os():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    before, after, released = done.stdout.split()
    assert released == "True"
    # the freed holes are about 125 MiB; the live half stays
    assert float(before) - float(after) > 80, done.stdout
    assert float(after) > 125, done.stdout
