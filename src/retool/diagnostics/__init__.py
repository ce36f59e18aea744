"""Checks before and around a run: ``retool preflight`` and ``retool doctor``.

``preflight`` rolls out a few questions with the configured policy and says
whether a run is worth paying for (:func:`run_preflight`); ``doctor`` checks
that this machine and the config can run at all (:func:`diagnose`). Both are
libraries with thin commands in :mod:`retool.cli`.
"""

from retool.diagnostics.doctor import Check, DoctorReport, diagnose
from retool.diagnostics.preflight import PreflightReport, assess, run_preflight

__all__ = ["Check", "DoctorReport", "PreflightReport", "assess", "diagnose", "run_preflight"]
