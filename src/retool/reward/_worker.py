"""Worker process for :mod:`retool.reward.verify`: one JSON check per line."""

from __future__ import annotations

import json
import logging
import sys
import warnings

from retool.reward.verify import equivalent_in_process


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)  # math-verify logs every parse failure
    import math_verify  # noqa: F401 - pay the imports before saying ready

    equivalent_in_process("1", "1")
    sys.stdout.write('["ready"]\n')
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            answer, reference = json.loads(line)
            reply = ["ok", equivalent_in_process(answer, reference)]
        except Exception as exc:
            reply = ["error", f"{type(exc).__name__}: {exc}"]
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
