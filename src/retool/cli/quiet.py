"""What the libraries print that carries nothing for the user: hidden unless ``-v``.

A ``retool eval`` used to open with transformers' "Loading weights" bar (272
steps of a 135M model), and remote runs with the SDKs' own ERROR log lines for
failures that retool retries and reports itself. None of it tells the user
anything retool's own lines do not, and it buries them. So, unless the
command line has ``-v`` / ``--verbose`` (accepted before or after the
command), :func:`quiet_libraries`:

* sets ``HF_HUB_DISABLE_PROGRESS_BARS`` and ``TRANSFORMERS_VERBOSITY=error``
  (and ``TRANSFORMERS_NO_ADVISORY_WARNINGS``) before transformers is imported
  (the CLI imports no model library at start-up), or through their API when
  one already is; a value the user set in the environment wins;
* ignores Python warnings raised from inside these libraries (deprecations,
  "this will change in a future version", dtype notes), never retool's own;
* raises the log level of the libraries' loggers to CRITICAL.

retool's own warnings and log lines are untouched: they name what failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Sequence

LIBRARIES = (
    "torch",
    "transformers",
    "peft",
    "huggingface_hub",
    "accelerate",
    "safetensors",
    "tokenizers",
    "gguf",
    "tinker",
    "pytrio",
    "httpx",
    "httpcore",
    "urllib3",
    "vllm",
)
ENVIRONMENT = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
FLAGS = ("-v", "--verbose")
HELP = "show the libraries' own warnings, log lines and loading bars (hidden by default)"


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """``-v`` on ``parser`` and on every (sub)command under it."""
    parser.add_argument(*FLAGS, action="store_true", help=HELP)
    todo = [parser]
    while todo:
        for action in todo.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                    # SUPPRESS: a command without -v keeps the value given before it
                    sub.add_argument(
                        *FLAGS, action="store_true", default=argparse.SUPPRESS, help=HELP
                    )
                    todo.append(sub)


def verbose_requested(argv: Sequence[str]) -> bool:
    """``-v`` anywhere before a ``--`` (read before parsing, so it applies to imports too)."""
    for word in argv:
        if word == "--":
            return False
        if word in FLAGS:
            return True
    return False


def quiet_libraries(verbose: bool) -> None:
    """Hide the libraries' noise (see the module docstring) unless ``verbose``."""
    if verbose:
        return
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    pattern = "({})(\\.|$)".format("|".join(LIBRARIES))
    warnings.filterwarnings("ignore", module=pattern)
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if "transformers" in sys.modules:  # imported already (in-process callers, tests)
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
