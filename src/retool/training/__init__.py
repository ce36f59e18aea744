"""Training: datums, micro-batches, the step loop, run directories, cold-start SFT.

* ``datum``       one shifted :class:`~retool.types.Datum` per trajectory
* ``aggregation`` seq_mean / token_mean / token_sum as per-datum advantage scales
* ``packing``     exact micro-batch packing by padded area
* ``metrics``     trainer metrics merged across micro-batches by meaning
* ``run_dir``     the crash-safe run directory, journal and checkpoint manifest
* ``loop``        ``train()``: the RL step loop (``retool train``)
* ``sft``         ``run_sft()``: cold-start supervised fine-tuning (``retool sft``)
"""

from retool.training.aggregation import AGGREGATIONS, scale_advantages
from retool.training.datum import (
    DatumError,
    TrainingDatum,
    build_datum,
    build_training_datums,
)
from retool.training.metrics import merge_trainer_metrics
from retool.training.packing import first_fit_decreasing, pack_micro_batches, padded_area
from retool.training.run_dir import CheckpointRecord, RunDirectory

__all__ = [
    "AGGREGATIONS",
    "CheckpointRecord",
    "DatumError",
    "RunDirectory",
    "TrainingDatum",
    "build_datum",
    "build_training_datums",
    "first_fit_decreasing",
    "merge_trainer_metrics",
    "pack_micro_batches",
    "padded_area",
    "scale_advantages",
]
