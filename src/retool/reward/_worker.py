"""Worker process for :mod:`retool.reward.verify`: one JSON check per line.

``python -m retool.reward._worker MEMORY_MB``. The worker caps its own address
space at ``MEMORY_MB`` MiB (``RLIMIT_AS``) before it imports anything, so every
check it makes runs under the cap. Replies go to a private copy of stdout; the
real stdout and stderr lead nowhere, so nothing math-verify or sympy prints
(from Python or C) can corrupt the line protocol.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import warnings


def main() -> None:
    memory = int(sys.argv[1]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stderr is /dev/null
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)  # math-verify logs every parse failure
    import math_verify  # noqa: F401 - pay the imports before saying ready

    from retool.reward.verify import equivalent_in_process

    equivalent_in_process("1", "1")
    replies.write('["ready"]\n')
    replies.flush()
    for line in sys.stdin:
        try:
            answer, reference = json.loads(line)
            reply = ["ok", equivalent_in_process(answer, reference)]
        except Exception as exc:  # MemoryError at the cap, RecursionError, a parse bug
            reply = ["error", f"{type(exc).__name__}: {str(exc)[:200]}"]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
