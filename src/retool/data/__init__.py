"""Math datasets: examples, loaders, batches, DAPO conversion and the demo set."""

from retool.data.batching import batch_indices, reserve_indices, take_batch, take_reserve
from retool.data.examples import MathExample, load_examples, write_jsonl
from retool.data.sources import load_dataset

__all__ = [
    "MathExample",
    "batch_indices",
    "load_dataset",
    "load_examples",
    "reserve_indices",
    "take_batch",
    "take_reserve",
    "write_jsonl",
]
