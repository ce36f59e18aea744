"""The local backend: PyTorch + transformers + PEFT on this machine (CPU or one GPU).

``LocalServiceClient`` is the entry point; see ``service.py``. The sampler is a
continuous-batching KV-cache engine (``engine.py``), the trainer computes the
built-in losses (``losses.py``) on chunked logprobs (``training.py``, its forward
pass in ``forward.py``).
"""

from retool.backends.local.models import ALIASES, load_model, load_tokenizer, resolve_model
from retool.backends.local.sampling import LocalSamplingClient
from retool.backends.local.service import LocalServiceClient
from retool.backends.local.training import LocalTrainingClient

__all__ = [
    "ALIASES",
    "LocalSamplingClient",
    "LocalServiceClient",
    "LocalTrainingClient",
    "load_model",
    "load_tokenizer",
    "resolve_model",
]
