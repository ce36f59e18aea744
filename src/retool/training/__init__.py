"""Training: datums, micro-batches, the step loop, run directories, cold-start SFT.

* ``datum``       one shifted :class:`~retool.types.Datum` per trajectory
* ``aggregation`` seq_mean / token_mean / token_sum as per-datum advantage scales
* ``packing``     exact micro-batch packing by padded area
* ``metrics``     trainer metrics merged across micro-batches by meaning
* ``run_dir``     the crash-safe run directory, journal and checkpoint manifest
* ``loop``        ``train()``: the RL step loop (``retool train``)
* ``sft``         ``run_sft()``: cold-start supervised fine-tuning (``retool sft``)
"""

from typing import TYPE_CHECKING

from retool.lazy import lazy_exports

if TYPE_CHECKING:
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

# imported on first use (retool/lazy.py): a command that fails on its settings, or only
# reads a run directory, does not load the training stack (numpy among it)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AGGREGATIONS": ".aggregation",
        "scale_advantages": ".aggregation",
        "DatumError": ".datum",
        "TrainingDatum": ".datum",
        "build_datum": ".datum",
        "build_training_datums": ".datum",
        "merge_trainer_metrics": ".metrics",
        "first_fit_decreasing": ".packing",
        "pack_micro_batches": ".packing",
        "padded_area": ".packing",
        "CheckpointRecord": ".run_dir",
        "RunDirectory": ".run_dir",
    },
)

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
