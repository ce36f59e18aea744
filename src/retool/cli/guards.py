"""Checks of the raw command line that no single option's parser can make.

An empty word (``--run-dir ""``, ``--model=``, a shell variable that was
never set) is refused before parsing: argparse accepts it as a value, and
each command then either fell back to its config default (``--run-dir ""``
trained into ``train.run_dir``) or treated it as "not given" (``--model ""``
said "--model is required"), so the user never learned that the value they
meant was lost. No option of ``retool`` takes an empty value.

A leading ``~`` in a word is expanded (:func:`expand_home`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def empty_argument(argv: Sequence[str]) -> str | None:
    """The error line for the first empty word of ``argv``, or ``None``."""
    for index, word in enumerate(argv):
        if word.startswith("--") and word.endswith("=") and len(word) > 3:
            flag = word[:-1]
        elif word == "" or not word.strip():
            before = argv[index - 1] if index else ""
            flag = before if before.startswith("-") and "=" not in before else ""
        else:
            continue
        if flag:
            return f"{flag} was given an empty value; give a value or leave {flag} out"
        return f"argument {index + 1} of the command line is empty; remove it or give a value"
    return None


def expand_home(argv: Sequence[str]) -> list[str]:
    """``argv`` with a leading ``~`` expanded in option values the shell left alone.

    The shell expands ``--run-dir ~/x`` but not ``--run-dir=~/x`` nor a quoted
    ``"~/x"``; expanding here makes ``~`` mean the home directory for every
    command and every spelling (``~`` in a config or ``--set`` path setting is
    expanded by the config itself).
    """
    out = []
    for word in argv:
        if word.startswith("~"):
            word = os.path.expanduser(word)
        elif word.startswith("--") and "=~" in word and not word.startswith("--set"):
            flag, value = word.split("=", 1)
            word = f"{flag}={os.path.expanduser(value)}"
        out.append(word)
    return out
