"""``python -m retool`` is the ``retool`` command."""

import sys

from retool.cli import main

sys.exit(main())
