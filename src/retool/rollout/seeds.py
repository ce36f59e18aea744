"""Sampling seeds: one per request, derived from where the request sits.

    seed = int.from_bytes(blake2b(f"{base}/{step}/{question}/{group}/{turn}",
                                  digest_size=8).digest(), "little") & (2**31 - 1)

``base`` is ``rollout.seed``, ``step`` the training step, ``question`` the
question's slot in the batch, ``group`` the branch in its group and ``turn``
the 0-based assistant turn. The first turn of a question is one request for
the whole group; it uses ``group = -1`` and the sampler derives each branch's
stream from that seed and the branch's index.

The reference added ``base + question + 10000 * turn``: the same slot at the
same turn got the same seed at every training step, so a skipped update
replayed identical samples, and nearby positions could collide. A hash of the
full position has neither problem, and it does not depend on when a request
is made, so results do not depend on the order in which trajectories finish.
"""

from __future__ import annotations

import hashlib

FIRST_TURN_GROUP = -1  # ``group`` of a question's shared first request


def sample_seed(base: int, step: int, question: int, group: int, turn: int) -> int:
    """A 31-bit seed for the request at this position (see the module docstring)."""
    key = f"{base}/{step}/{question}/{group}/{turn}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
