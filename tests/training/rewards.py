"""A reward a random model can earn, so tests see non-zero advantages and real updates."""


def even_length(text: str, reference: str) -> float:
    """+1 when the final text has an even number of characters, -1 otherwise."""
    del reference
    return 1.0 if len(text) % 2 == 0 else -1.0


CALLS = {"n": 0}


def even_length_then_fail(text: str, reference: str) -> float:
    """``even_length`` for the first 8 calls (one step of 2 x 4), then a crash."""
    CALLS["n"] += 1
    if CALLS["n"] > 8:
        raise RuntimeError("the reward service went away")
    return even_length(text, reference)


def alike_for_half(text: str, reference: str) -> float:
    """-1 whatever the text for references of 4 or more characters (about half of
    demo:train's answers; their groups score alike), else ``even_length``: steps with
    groups for dynamic sampling to filter, and groups that train. A rule on the
    reference alone, so which groups are filtered does not depend on the model."""
    if len(reference) >= 4:
        return -1.0
    return even_length(text, reference)
