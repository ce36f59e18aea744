"""vLLM as the rollout sampler (``[sampler] engine = "vllm"``; the ``vllm`` extra).

* :mod:`~retool.backends.vllm.convert`: our sampling contract as vLLM's
  request fields, its outputs as our :class:`~retool.types.SampledSequence`
  (no ``vllm`` import; shared with the ``vllm serve`` client);
* :mod:`~retool.backends.vllm.engine`: one in-process engine per run, driven
  by one thread, and the per-step :class:`VllmSamplingClient` the rollout uses;
* :mod:`~retool.backends.vllm.sync`: the trainer's weights in the form the
  engine loads (``lora`` adapters or ``merged`` weights).

``vllm`` itself is imported only when an engine starts, so the rest of the
project imports and tests without it.
"""
