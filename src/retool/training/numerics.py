"""Sampler/trainer numerics in the RL step: π_old, rollout correction, the mismatch.

The sampler and the trainer compute the same policy with different code (and,
when ``model.dtype`` picks bf16 for one of them, different precision), so the
sampler's logprobs and the trainer's differ by a little. Under float32 here
that is ~1e-5 per token (the 1e-4 contract of the local backend); a bf16
sampler differs by 0.03 on average and up to ~1 (docs/measurements.md, "Facts
the code cites"). This module makes what the RL step does about it explicit:

* ``train.old_logprobs``: ``sampler`` uses the sampled logprobs as π_old
  (exact under float32); ``recompute`` runs one ``forward`` of the trainer on
  the step's datums before the first ``forward_backward`` and uses those
  (``time/recompute_s``), for every update of the step before the first
  (``train.updates_per_step``, :mod:`retool.training.updates`). With one update
  per step every ``forward_backward`` runs before its ``optim_step``, so the
  recomputed π_old equals what the step's first forward computes anyway:
  ``recompute`` costs one forward and changes the PPO ratio from π/π_sampler to
  π/π_trainer (its clipping then sees only the update, while the correction
  below handles the mismatch); with several updates it also keeps π_old the
  policy before the step's first update for all of them.
* ``train.rollout_correction``: ``tis`` caps each token's importance weight
  ρ = π_trainer/π_sampler at C (``rollout_correction_cap``), ``mis`` drops a
  trajectory whose sequence ratio exp(Σ log ρ) leaves [1/C, C], ``none`` does
  nothing; ``auto`` (the default) is ``none`` when both roles run float32
  (ρ is 1 to ~1e-5: nothing to correct) and ``tis`` otherwise (verl's default,
  cap 2: a token-level cap bounds the variance a few badly mismatched tokens
  add without discarding whole trajectories, as ``mis`` would for every long
  bf16 trajectory whose small per-token errors add up). On the local backend
  the correction is applied in the loss (:mod:`retool.backends.local.losses`),
  in both ``old_logprobs`` modes. With ``train.max_off_policy_steps = k >= 1``
  the sampler is k steps behind the trainer, so ``auto`` is ``tis`` wherever it
  can be applied, whatever the dtypes. A remote service's loss cannot be changed, so
  there it goes through the advantages (a detached positive weight per token
  scales the per-token loss of every built-in loss exactly), which needs the
  trainer's logprobs before the update: ``old_logprobs = "recompute"``; with
  ``sampler`` a correction is refused at start.
* The mismatch is logged every step: ``train/sampler_kl`` (mean over loss
  tokens of log π_sampler - log π_trainer), ``train/sampler_clip_fraction``
  (share of loss tokens whose ρ is outside [clip_low, clip_high]) and, with a
  correction, ``train/correction_fraction`` (share truncated or masked). The
  local backend computes them in every micro-batch's loss; remote ones from
  the recompute forward or, with sampler logprobs, from the service's own
  ratio metrics (``approx_kl``, ``clip_fraction``: with π_old = π_sampler and
  no update yet, those are the mismatch).

The chosen numerics are written to ``numerics.json`` in the run directory;
``--resume`` reads them back so an ``auto`` run keeps its choice, and refuses
a run whose numerics would change.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retool.backends import correction_in_loss
from retool.config import RunConfig
from retool.data.files import write_atomic
from retool.errors import ConfigError
from retool.training.datum import TrainingDatum
from retool.types import Datum, TensorData, TrainingClient

if TYPE_CHECKING:  # the local backend imports torch: its value types only here
    from retool.backends.local.compiled import CompileChoice
    from retool.backends.local.dtype import Numerics
    from retool.backends.vllm.choice import EngineChoice
    from retool.training.run_dir import RunDirectory
    from retool.training.session import Phases

NUMERICS_FILE = "numerics.json"
CORRECTION_CODES = {"none": 0, "tis": 1, "mis": 2}
SAMPLER_LOGPROBS = "sampler_logprobs"  # as retool.backends.local.losses.SAMPLER_LOGPROBS


# -- the run directory ---------------------------------------------------------------


def read_numerics(run_path: Path) -> Numerics | None:
    """The recorded :class:`~retool.backends.local.dtype.Numerics`, or None.

    A damaged file (not JSON, not an object, a field of the wrong type or an
    unknown dtype) is one :class:`ConfigError` naming the file and the field.
    """
    path = Path(run_path) / NUMERICS_FILE
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not the run's numerics; start a new run")
    if not path.exists():
        return None
    from retool.backends.local.dtype import Numerics

    try:
        text = path.read_bytes().decode("utf-8")
        data = json.loads(text)
    except OSError as exc:
        raise ConfigError(f"{path}: unreadable ({exc.strerror}); check its permissions") from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"{path}: unreadable (not UTF-8 text); restore it or start a new run"
        ) from None
    except ValueError as exc:  # invalid JSON, or an integer too long to convert
        raise ConfigError(
            f"{path}: unreadable (not JSON: {str(exc)[:120]}); restore it or start a new run"
        ) from None
    try:
        return Numerics.from_dict(data)
    except ValueError as exc:
        raise ConfigError(
            f"{path}: unreadable ({exc}); the run directory is damaged: restore that file "
            "or start a new run"
        ) from None


def check_supported(config: RunConfig) -> None:
    """Refuse, in one line, a setting the configured backend cannot express."""
    cfg = config.train
    if (
        not correction_in_loss(config.model)
        and cfg.rollout_correction in ("tis", "mis")
        and cfg.old_logprobs != "recompute"
    ):
        raise ConfigError(
            f"train.rollout_correction = {cfg.rollout_correction!r} on {config.model.backend} "
            'needs train.old_logprobs = "recompute": the service\'s loss cannot be changed, so '
            "the correction goes through the advantages, computed from a trainer forward"
        )


def sampler_numerics(numerics: Numerics | None, config: RunConfig) -> Numerics | None:
    """The run's numerics with a vLLM sampler's dtype (``sampler.dtype``) for the sampler role."""
    if numerics is None or config.sampler.engine != "vllm":
        return numerics
    return dataclasses.replace(numerics, sampler=config.sampler.dtype)


def record_numerics(
    run: RunDirectory,
    service: object,
    resume: bool,
    numerics: Numerics | None = None,
    compile_choice: CompileChoice | None = None,
    engine_choice: EngineChoice | None = None,
) -> None:
    """Write ``numerics.json`` (and a log line); on resume, refuse a change.

    ``compile_choice`` (the trainer's :class:`~retool.backends.local.compiled.CompileChoice`)
    is logged in every process (a resumed one may decide differently: it changes speed,
    not the numerics class) and stored with the first record. ``engine_choice``
    (``sampler.engine``: :mod:`retool.backends.vllm.choice`) likewise: printed and
    logged when ``auto`` chose, stored as ``sampler_engine``."""
    if engine_choice is not None and engine_choice.requested == "auto":
        print(engine_choice.line(), file=sys.stderr)
        run.log(engine_choice.line())
    numerics = numerics or getattr(service, "numerics", None)
    if numerics is None:
        return
    if compile_choice is not None:
        run.log(f"trainer: {compile_choice.summary()}")
    recorded = read_numerics(run.path) if resume else None
    if recorded is not None and (recorded.sampler, recorded.trainer) != (
        numerics.sampler,
        numerics.trainer,
    ):
        raise ConfigError(
            f"--resume: numerics changed (recorded in {Path(run.path) / NUMERICS_FILE}: "
            f"{recorded.summary()}; now: {numerics.summary()}); set model.dtype to the recorded "
            "dtype or start a new run"
        )
    if recorded is None:
        record = numerics.to_dict()
        if compile_choice is not None:
            record["compile"] = dataclasses.asdict(compile_choice)
        if engine_choice is not None:
            record["sampler_engine"] = engine_choice.to_dict()
        text = json.dumps(record, indent=2) + "\n"
        write_atomic(Path(run.path) / NUMERICS_FILE, text.encode())
        run.log(f"numerics: {numerics.summary()}")


def resolve_correction(setting: str, numerics: Numerics | None, lagged: bool = False) -> str:
    """``auto`` -> ``none`` when both roles are float32 (or unknown: a remote service) and
    the sampler is the trainer's policy; ``tis`` when ``lagged`` (``train.max_off_policy_steps``
    and a place to apply it: the local loss, or ``old_logprobs = "recompute"``), where
    π_sampler is k steps behind π_trainer."""
    if setting != "auto":
        return setting
    if lagged:
        return "tis"
    if numerics is None or numerics.all_float32:
        return "none"
    return "tis"


# -- the correction (host side, for remote services) --------------------------------


def correction_weights(
    log_rho: Sequence[np.ndarray], active: Sequence[np.ndarray], mode: str, cap: float
) -> tuple[list[np.ndarray], int]:
    """Per datum, the weight each token's loss is scaled by (π_old = π_trainer), and the count
    of loss tokens truncated or masked. The same rule as the local loss's
    ``correction_weights``: TIS ``min(ρ, C)``; MIS 1 or 0 per datum by ``exp(Σ log ρ)``."""
    weights, cut = [], 0
    for lr, act in zip(log_rho, active, strict=True):
        rho = np.exp(lr.astype(np.float64))
        if mode == "tis":
            cut += int(((rho > cap) & act).sum())
            w = np.minimum(rho, cap)
        elif mode == "mis":
            keep = abs(float(lr[act].sum())) <= math.log(cap)
            cut += 0 if keep else int(act.sum())
            w = np.full_like(rho, 1.0 if keep else 0.0)
        else:
            w = np.ones_like(rho)
        weights.append(np.where(act, w, 1.0))
    return weights, cut


def mismatch_metrics(
    log_rho: Sequence[np.ndarray], active: Sequence[np.ndarray], low: float, high: float
) -> dict[str, float]:
    """``sampler_kl`` and ``sampler_clip_fraction`` over the loss tokens."""
    diffs = [lr[a].astype(np.float64) for lr, a in zip(log_rho, active, strict=True)]
    flat = np.concatenate(diffs) if diffs else np.zeros(0)
    n = max(flat.size, 1)
    rho = np.exp(flat)
    return {
        "sampler_kl": float(-flat.sum()) / n,
        "sampler_clip_fraction": float(((rho < low) | (rho > high)).sum()) / n,
    }


# -- the step -------------------------------------------------------------------------


@dataclass
class StepNumerics:
    """What :func:`prepare_step` hands to the updates, and the metrics it adds after."""

    updates: list[list[list[TrainingDatum]]]  # per update, its micro-batches
    loss_config: dict[str, float] | None
    metrics: dict[str, float] = field(default_factory=dict)  # host-computed train/* metrics
    derive_from_ratio: bool = False  # remote + sampler logprobs: mismatch = the ratio metrics

    def finish(self, first_update: Mapping[str, float]) -> dict[str, float]:
        """The mismatch metrics to add to the step's (never overriding the trainer's);
        ``first_update``: the first update's metrics, measured before any weight moved."""
        out = {k: v for k, v in self.metrics.items() if k not in first_update}
        if self.derive_from_ratio:
            for ours, theirs in (("sampler_kl", "approx_kl"), ("sampler_clip_fraction", "clip")):
                name = "train/clip_fraction" if theirs == "clip" else f"train/{theirs}"
                if f"train/{ours}" not in first_update and name in first_update:
                    out[f"train/{ours}"] = float(first_update[name])
        return out


def _with_inputs(item: TrainingDatum, **arrays: np.ndarray) -> TrainingDatum:
    """A copy of ``item`` with loss inputs replaced."""
    inputs = dict(item.datum.loss_fn_inputs)
    inputs.update({k: TensorData.from_numpy(v.astype(np.float32)) for k, v in arrays.items()})
    return dataclasses.replace(item, datum=Datum(item.datum.model_input, inputs))


def prepare_step(
    trainer: TrainingClient,
    updates: list[list[list[TrainingDatum]]],
    config: RunConfig,
    numerics: Numerics | None,
    loss_config: dict[str, float] | None,
    phases: Phases,
) -> StepNumerics:
    """Apply ``train.old_logprobs`` and ``train.rollout_correction`` to the step's updates
    (each a list of micro-batches); with ``recompute``, one trainer ``forward`` per
    micro-batch of every update, all before the first update trains."""
    cfg, local = config.train, correction_in_loss(config.model)
    lagged = cfg.max_off_policy_steps > 0 and (local or cfg.old_logprobs == "recompute")
    correction = resolve_correction(cfg.rollout_correction, numerics, lagged)
    low, high = cfg.clip_low, cfg.clip_high
    step_config = dict(loss_config or {})
    if local and correction != "none":
        step_config["rollout_correction"] = float(CORRECTION_CODES[correction])
        step_config["rollout_correction_cap"] = float(cfg.rollout_correction_cap)
    if cfg.old_logprobs != "recompute" or not any(updates):
        return StepNumerics(updates, step_config or None, derive_from_ratio=not local)
    out_updates: list[list[list[TrainingDatum]]] = []
    log_rho, active = [], []
    cut = 0
    with phases("recompute"):
        for micro_batches in updates:
            out_batches: list[list[TrainingDatum]] = []
            for batch in micro_batches:
                result = trainer.forward([d.datum for d in batch], cfg.loss, loss_config).result()
                new_batch = []
                for item, output in zip(batch, result.loss_fn_outputs, strict=True):
                    inputs = item.datum.loss_fn_inputs
                    sampler = inputs["logprobs"].to_numpy().astype(np.float64).reshape(-1)
                    advantages = inputs["advantages"].to_numpy().astype(np.float64).reshape(-1)
                    trained = output["logprobs"].to_numpy().astype(np.float64).reshape(-1)
                    act = advantages != 0
                    lr = np.where(act, trained - sampler, 0.0)
                    log_rho.append(lr)
                    active.append(act)
                    if local:  # the loss applies the correction and measures the mismatch
                        new_batch.append(
                            _with_inputs(item, logprobs=trained, sampler_logprobs=sampler)
                        )
                        continue
                    cap = cfg.rollout_correction_cap
                    (weight,), n_cut = correction_weights([lr], [act], correction, cap)
                    cut += n_cut
                    scaled = advantages * weight
                    new_batch.append(_with_inputs(item, logprobs=trained, advantages=scaled))
                out_batches.append(new_batch)
            out_updates.append(out_batches)
    metrics: dict[str, float] = {}
    if not local:
        metrics = {f"train/{k}": v for k, v in mismatch_metrics(log_rho, active, low, high).items()}
        if correction != "none":
            tokens = max(int(sum(a.sum() for a in active)), 1)
            metrics["train/correction_fraction"] = cut / tokens
    return StepNumerics(out_updates, step_config or None, metrics)
