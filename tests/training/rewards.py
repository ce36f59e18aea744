"""A reward a random model can earn, so tests see non-zero advantages and real updates."""


def even_length(text: str, reference: str) -> float:
    """+1 when the final text has an even number of characters, -1 otherwise."""
    del reference
    return 1.0 if len(text) % 2 == 0 else -1.0
