"""Math datasets: examples, loaders, batches, DAPO conversion and the demo set."""

from retool.data.batching import batch_indices, take_batch
from retool.data.examples import MathExample, load_examples, write_jsonl
from retool.data.sources import load_dataset

__all__ = [
    "MathExample",
    "batch_indices",
    "load_dataset",
    "load_examples",
    "take_batch",
    "write_jsonl",
]
