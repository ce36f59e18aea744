"""``retool prepare-data``: turn public datasets into our JSONL splits.

Both forms write several files into ``--output-dir`` all-or-nothing
(:func:`retool.data.files.staged_output`): the directory is checked first,
the splits are written to a staging directory inside it and renamed into
place together, so a failure or an interrupt leaves the directory as it was.
Replacing existing split files is announced.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from retool.cli.common import add_number
from retool.data.dapo import prepare_dapo_math
from retool.data.demo import ALL_SPLITS, demo_examples
from retool.data.examples import write_jsonl
from retool.data.files import staged_output


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare-data",
        help="convert a dataset into train/dev JSONL files",
        description="Convert a dataset into train.jsonl/dev.jsonl files with the fields "
        "id, question, answer, data_source. Existing split files in --output-dir are "
        "replaced (and listed); on any error none is.",
    )
    kinds = parser.add_subparsers(dest="kind", metavar="DATASET", required=True)

    dapo = kinds.add_parser(
        "dapo-math",
        help="DAPO-Math-17k Parquet -> train.jsonl + dev.jsonl",
        description="Read the DAPO-Math-17k Parquet file (the Hugging Face dataset "
        "BytedTsinghua-SIA/DAPO-Math-17k, file data/dapo-math-17k.parquet; download it "
        "yourself, retool never downloads at run time). Columns used: prompt (a list of "
        "chat messages; prompt[0].content is the question), reward_model.ground_truth (the "
        "answer) and extra_info.index (the id); other columns are ignored. Strips the "
        "'Answer:' wrapper, drops exact repeats and splits off a dev set.",
    )
    dapo.add_argument(
        "--input",
        required=True,
        type=Path,
        help="the DAPO-Math-17k .parquet file (columns prompt, reward_model, extra_info)",
    )
    dapo.add_argument("--output-dir", required=True, type=Path, help="where to write the splits")
    add_number(dapo, "--dev-size", low=0, high=10**7, default=50, help="questions held out")
    add_number(dapo, "--seed", low=0, high=2**32 - 1, default=42, help="seed of the dev split")
    dapo.set_defaults(handler=_run_dapo)

    demo = kinds.add_parser(
        "demo",
        help="write the bundled demo dataset as JSONL",
        description="Write the deterministic demo dataset (train/dev/test/paraphrase, and "
        "varied: train's problems asked more ways) as JSONL.",
    )
    demo.add_argument("--output-dir", required=True, type=Path, help="where to write the splits")
    demo.set_defaults(handler=_run_demo)


def _replaced(directory: Path, names: list[str]) -> None:
    if names:
        print(f"replaced the existing {', '.join(names)} in {directory}")


def _run_dapo(args: argparse.Namespace) -> int:
    report = prepare_dapo_math(
        args.input, args.output_dir, dev_size=args.dev_size, seed=args.seed, flag="--output-dir"
    )
    print(f"read {report.rows} rows from {args.input}; dropped {report.duplicates} exact repeats")
    print(f"wrote {report.train} train examples to {report.train_path}")
    print(f"wrote {report.dev} dev examples to {report.dev_path}")
    _replaced(args.output_dir, list(report.replaced))
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    names = [f"{split}.jsonl" for split in ALL_SPLITS]
    counts = {}
    with staged_output(args.output_dir, flag="--output-dir", names=names) as staged:
        for split in ALL_SPLITS:
            counts[split] = write_jsonl(staged.path(f"{split}.jsonl"), demo_examples(split))
    for split in ALL_SPLITS:
        print(f"wrote {counts[split]} {split} examples to {args.output_dir / f'{split}.jsonl'}")
    _replaced(args.output_dir, staged.replaced)
    return 0
