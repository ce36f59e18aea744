"""Benchmarks, each a script (``python bench/NAME.py``); a package so that the tests can
import the helpers they share with it (:mod:`bench.vllm_launcher`)."""
