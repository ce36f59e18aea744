"""Sandbox benchmark: fresh `python -c` (the reference) vs our fork server.

    .venv/bin/python bench/sandbox.py [--n 30] [--workers 2]

Prints median/p95 latency for three snippets under both approaches, the cost of
full isolation over the same path without it, and throughput with 1 and N
workers, all measured in this one run.
"""

import argparse

from retool.sandbox.bench import run_bench

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    run_bench(n=args.n, workers=args.workers)
