"""``retool prepare-data``: turn public datasets into our JSONL splits."""

from __future__ import annotations

import argparse
from pathlib import Path

from retool.data.dapo import prepare_dapo_math
from retool.data.demo import SPLITS, demo_examples
from retool.data.examples import write_jsonl


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare-data",
        help="convert a dataset into train/dev JSONL files",
        description="Convert a dataset into train.jsonl/dev.jsonl files with the fields "
        "id, question, answer, data_source.",
    )
    kinds = parser.add_subparsers(dest="kind", metavar="DATASET", required=True)

    dapo = kinds.add_parser(
        "dapo-math",
        help="DAPO-Math-17k Parquet -> train.jsonl + dev.jsonl",
        description="Read the DAPO-Math-17k Parquet layout (prompt[0].content, "
        "reward_model.ground_truth, extra_info.index), strip the 'Answer:' wrapper, "
        "drop exact repeats and split off a dev set.",
    )
    dapo.add_argument("--input", required=True, type=Path, help="the raw .parquet file")
    dapo.add_argument("--output-dir", required=True, type=Path, help="where to write the splits")
    dapo.add_argument("--dev-size", type=int, default=50, help="questions held out (default 50)")
    dapo.add_argument("--seed", type=int, default=42, help="seed of the dev split (default 42)")
    dapo.set_defaults(handler=_run_dapo)

    demo = kinds.add_parser(
        "demo",
        help="write the bundled demo dataset as JSONL",
        description="Write the deterministic demo dataset (train/dev/test) as JSONL files.",
    )
    demo.add_argument("--output-dir", required=True, type=Path, help="where to write the splits")
    demo.set_defaults(handler=_run_demo)


def _run_dapo(args: argparse.Namespace) -> int:
    report = prepare_dapo_math(args.input, args.output_dir, dev_size=args.dev_size, seed=args.seed)
    print(f"read {report.rows} rows from {args.input}; dropped {report.duplicates} exact repeats")
    print(f"wrote {report.train} train examples to {report.train_path}")
    print(f"wrote {report.dev} dev examples to {report.dev_path}")
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    for split in SPLITS:
        path = args.output_dir / f"{split}.jsonl"
        count = write_jsonl(path, demo_examples(split))
        print(f"wrote {count} {split} examples to {path}")
    return 0
