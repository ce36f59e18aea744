"""One config system: frozen dataclasses, validated on construction, read from TOML.

A run is described by :class:`RunConfig`, one TOML table per section::

    [rollout]
    group_size = 8
    protocol = "markdown"

    [sandbox]
    timeout = 10.0

Any value can be overridden on the command line with ``--set
section.key=value`` (the value is parsed as TOML, falling back to a plain
string). Every check raises :class:`~retool.errors.ConfigError` naming the field
and the allowed range, so a bad value fails before any model is loaded instead
of hanging a worker pool or crashing at datum-build time, as the reference did.

One module per TOML section (``model``, ``data``, ``rollout``, ``sandbox``,
``reward``, ``train``, ``cost``, ``demo``, ``sampler``), each a frozen
dataclass that checks its own fields with :mod:`~retool.config.fields`;
:mod:`~retool.config.run` holds :class:`RunConfig` and the checks that span
two sections; :mod:`~retool.config.loader` reads the file and the ``--set``
overrides. The limits a leaf enforces (the sandbox's ranges, the services'
LoRA ranks, the reward workers') come from :mod:`retool.limits`, so the config
refuses what the leaf would without importing any backend. Callers import
from this package: ``from retool.config import RunConfig, load_config``.
"""

from retool.config.cost import CostConfig
from retool.config.data import DataConfig
from retool.config.demo import DemoConfig
from retool.config.loader import build_section, load_config, load_config_given, parse_override
from retool.config.model import LOSS_REDUCTIONS, ModelConfig
from retool.config.reward import RewardConfig
from retool.config.rollout import RolloutConfig
from retool.config.run import RunConfig
from retool.config.sampler import SamplerConfig
from retool.config.sandbox import SandboxConfig
from retool.config.train import TrainConfig

__all__ = [
    "LOSS_REDUCTIONS",
    "CostConfig",
    "DataConfig",
    "DemoConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SamplerConfig",
    "SandboxConfig",
    "TrainConfig",
    "build_section",
    "load_config",
    "load_config_given",
    "parse_override",
]
