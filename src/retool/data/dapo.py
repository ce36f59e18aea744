"""Convert the DAPO-Math-17k Parquet layout into our JSONL splits.

DAPO-Math-17k rows look like::

    {"data_source": "math_dapo",
     "prompt": [{"role": "user", "content": "Solve the following ... \\n\\n<question>\\n\\n
                 Remember to put your answer on its own line after \\"Answer:\\"."}],
     "reward_model": {"ground_truth": "34", "style": "rule"},
     "extra_info": {"index": "9a9b6eb4-..."}}

We keep the bare question (the "Answer:" instructions conflict with our
``\\boxed{}`` system prompt), the ground truth and the index. The published
file repeats each problem many times; exact repeats are dropped and counted.
The prefix/suffix are removed as exact strings (``str.lstrip`` with a phrase, a
common bug, eats leading letters of the question).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.checks import check_number
from retool.data.examples import MathExample, id_field, json_kind, text_field, write_jsonl
from retool.data.files import check_output_dir, staged_output
from retool.errors import DataError

SPLIT_FILES = ("train.jsonl", "dev.jsonl")

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'


@dataclass(frozen=True)
class PrepareReport:
    """What ``prepare_dapo_math`` read and wrote."""

    rows: int  # rows in the input file
    duplicates: int  # exact repeats of an earlier (question, answer) dropped
    train: int  # examples written to train.jsonl
    dev: int  # examples written to dev.jsonl
    train_path: Path
    dev_path: Path
    replaced: tuple[str, ...] = ()  # files of output_dir that existed and were replaced


def strip_dapo_wrapper(content: str) -> str:
    """The bare question inside a DAPO prompt (unchanged if the wrapper is absent)."""
    text = content.strip()
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX) :]
    if text.endswith(DAPO_SUFFIX):
        text = text[: -len(DAPO_SUFFIX)]
    return text.strip()


def _dapo_row(record: dict[str, Any], where: str) -> MathExample:
    prompt = record.get("prompt")
    if not isinstance(prompt, list | tuple) or not prompt or not isinstance(prompt[0], dict):
        raise DataError(f"{where}: 'prompt' must be a non-empty list of messages")
    content = prompt[0].get("content")
    if content is None:
        raise DataError(f"{where}: 'prompt[0].content' is missing or empty")
    content = text_field(content, where, "prompt[0].content")
    reward_model = record.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if truth is None or (isinstance(truth, str) and not truth.strip()):
        raise DataError(f"{where}: 'reward_model.ground_truth' is missing or empty")
    # a number is its decimal text; a list, object, boolean or NaN is no answer
    truth = text_field(truth, where, "reward_model.ground_truth", numbers=True)
    extra = record.get("extra_info")
    index = extra.get("index") if isinstance(extra, dict) else None
    if index is None or (isinstance(index, str) and not index.strip()):
        raise DataError(f"{where}: 'extra_info.index' is missing")
    index = id_field(index, where, "extra_info.index")
    source = record.get("data_source")
    if source is not None and not isinstance(source, str):
        raise DataError(f"{where}: field 'data_source' must be a string, got {json_kind(source)}")
    question = strip_dapo_wrapper(content)
    if not question:
        raise DataError(f"{where}: the question is empty once the DAPO wrapper is removed")
    return MathExample(
        id=index,
        question=question,
        answer=truth.strip(),
        data_source=source or "dapo-math-17k",
    )


def prepare_dapo_math(
    input_path: str | Path,
    output_dir: str | Path,
    dev_size: int = 50,
    seed: int = 42,
    *,
    flag: str | None = None,
) -> PrepareReport:
    """Write ``train.jsonl`` and ``dev.jsonl`` under ``output_dir``, both or neither.

    The output directory is checked first, every row is validated before
    anything is written, and the two files are renamed into place together
    (:func:`~retool.data.files.staged_output`), so any failure leaves
    ``output_dir`` as it was. ``flag`` names ``output_dir`` in errors.
    """
    import pyarrow.parquet as pq

    input_path = Path(input_path)
    check_number("--dev-size", dev_size, 0, 10**7, integer=True)
    check_number("--seed", seed, 0, 2**32 - 1, integer=True)
    check_output_dir(output_dir, flag=flag, error=DataError)
    if not input_path.exists():
        raise DataError(f"{input_path}: no such file")
    if not input_path.is_file():
        raise DataError(f"{input_path}: not a file; give the DAPO-Math-17k .parquet file")
    try:
        table = pq.read_table(input_path)
    except Exception as exc:  # pyarrow raises several unrelated types
        raise DataError(f"{input_path}: not a readable Parquet file ({exc})") from exc
    missing = {"prompt", "reward_model", "extra_info"} - set(table.column_names)
    if missing:
        raise DataError(
            f"{input_path}: missing column(s) {sorted(missing)}; expected the DAPO-Math-17k layout"
        )
    examples: list[MathExample] = []
    seen_content: dict[tuple[str, str], str] = {}
    seen_ids: dict[str, tuple[str, str]] = {}
    duplicates = 0
    rows = table.num_rows
    for row, record in enumerate(table.to_pylist(), start=1):
        where = f"{input_path}:{row}"
        example = _dapo_row(record, where)
        key = (example.question, example.answer)
        if key in seen_content:
            duplicates += 1
            continue
        if example.id in seen_ids:
            raise DataError(f"{where}: id {example.id!r} already used by a different question")
        seen_content[key] = example.id
        seen_ids[example.id] = key
        examples.append(example)
    if not examples:
        raise DataError(f"{input_path}: contains no rows")
    if dev_size >= len(examples):
        raise DataError(
            f"--dev-size {dev_size} leaves no training data ({len(examples)} unique questions)"
        )
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    dev_idx = set(order[:dev_size])
    dev = [e for i, e in enumerate(examples) if i in dev_idx]
    train = [e for i, e in enumerate(examples) if i not in dev_idx]
    out = Path(output_dir)
    with staged_output(out, flag=flag, names=SPLIT_FILES) as staged:
        write_jsonl(staged.path("train.jsonl"), train)
        write_jsonl(staged.path("dev.jsonl"), dev)
    return PrepareReport(
        rows=rows,
        duplicates=duplicates,
        train=len(train),
        dev=len(dev),
        train_path=out / "train.jsonl",
        dev_path=out / "dev.jsonl",
        replaced=tuple(staged.replaced),
    )
