"""A run's weight sync over ``vllm serve``: each step's LoRA adapter published to the servers.

``[sampler] engine = "vllm"`` with ``urls``: :func:`open_server_sampler` makes
the run's :class:`ServerPolicySampler`, whose ``snapshot()`` is the step's
sampling client (:mod:`~retool.backends.vllm.server_sampler`).

Design, and why:

* **Adapters only.** After each optimizer step the trainer's PEFT adapter
  directory is published to every server
  (:meth:`~retool.backends.vllm.servers.VllmServers.publish`) and the older
  one unloaded; ``merged`` sync needs the engine in this process and is refused
  here, as is a trainer without LoRA.
* **Names are per run.** The adapter is served as ``policy-step-N.<run tag>``:
  a server may outlive a run and serve several, which must not share names, so
  a reply's model name is evidence of this run's step N.
* **All or nothing.** The trainer writes the adapter under a temporary name and
  renames it; one that a server refuses (or an interrupt cuts) is unloaded from
  the servers that took it and its directory deleted (with
  ``checkpoints/sampler`` when left empty), so a run that stops there leaves
  nothing of it behind.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from retool.backends.vllm.policy_sync import StepSynced
from retool.backends.vllm.server_sampler import ServerSamplingClient
from retool.backends.vllm.servers import VllmServers
from retool.backends.vllm.sync import remove_adapter
from retool.errors import ConfigError
from retool.types import TrainingClient

if TYPE_CHECKING:  # config sits a floor above the backends: annotations only
    from retool.config import RunConfig

POLICY_PREFIX = "policy-step-"  # adapter names: policy-step-N, N = optimizer steps taken


def policy_name(step: int, run_tag: str = "") -> str:
    """The served name of the policy after ``step`` optimizer steps (``policy-step-N``), with
    the run's tag when given (``policy-step-N.3fa9c1``)."""
    return f"{POLICY_PREFIX}{int(step)}" + (f".{run_tag}" if run_tag else "")


class ServerPolicySampler(StepSynced):
    """The run's vLLM servers, kept on the trainer's policy by publishing its adapter.

    ``snapshot()`` is the step's sampling client: when the trainer took an
    optimizer step since the last one (or at the first call: the initial
    adapter is not zero after ``--init-from``), its adapter is saved
    (``save_weights_for_sampler``), published to every server as
    ``policy-step-N`` and the previous one unloaded and deleted.
    ``sync_seconds`` holds the time of each publish (saving included).
    """

    def __init__(self, trainer: TrainingClient, servers: VllmServers, keep: int = 1) -> None:
        """``keep``: adapters left loaded (the newest); ``train.max_off_policy_steps + 1``,
        so the older policies the overlapped steps still sample with stay served."""
        if getattr(trainer, "lora", None) is None:
            raise ConfigError(
                "sampler.urls (vllm serve) syncs LoRA adapters: set model.lora_rank > 0"
            )
        self.trainer = trainer
        self.servers = servers
        self.tokenizer = trainer.get_tokenizer()
        self.base = servers.base_model()
        # Servers outlive runs and may serve several: a tag per run keeps two runs' (or a
        # crashed run's) policy-step-N apart, so a reply's model name is evidence of this run.
        self.run_tag = secrets.token_hex(3)
        self.synced_step: int | None = None
        self.sync_seconds: list[float] = []
        self.keep = max(1, keep)
        self._adapter_dirs: list[Path] = []  # the loaded adapters' directories, oldest first

    def snapshot(self) -> ServerSamplingClient:
        step = self.catch_up()
        return self.servers.client(
            policy_name(step, self.run_tag), self.tokenizer, self.base.max_model_len
        )

    def _sync(self, step: int) -> None:
        self.publish(step)

    def publish(self, step: int) -> None:
        """Save the trainer's adapter; load it on every server as ``policy-step-<step>.<tag>``.

        All or nothing: the trainer writes the adapter under a temporary name and
        renames it (never a partial directory), and one that a server refused (or
        an interrupt during the load) is unloaded and deleted again, so a run that
        fails here leaves no ``vllm_server_policy_step_N`` behind.
        """
        saved = self.trainer.save_weights_for_sampler(f"vllm_server_policy_step_{step:06d}")
        path = Path(saved.result().path)
        try:
            self.servers.publish(policy_name(step, self.run_tag), path, keep=self.keep)
        except BaseException:
            if path not in self._adapter_dirs:
                remove_adapter(path)
            raise
        if path in self._adapter_dirs:
            self._adapter_dirs.remove(path)
        self._adapter_dirs.append(path)
        while len(self._adapter_dirs) > self.keep:  # unloaded by publish: delete them too
            remove_adapter(self._adapter_dirs.pop(0))

    def close(self) -> None:
        """Unload the run's adapters from the servers and delete the last one's directory."""
        self.servers.close()
        while self._adapter_dirs:
            remove_adapter(self._adapter_dirs.pop())


def open_server_sampler(config: RunConfig, trainer: TrainingClient) -> ServerPolicySampler:
    """The :class:`ServerPolicySampler` of a run config's ``sampler.urls``."""
    sampler = config.sampler
    if sampler.sync != "lora":
        raise ConfigError(
            'sampler.urls (vllm serve) syncs by adapter only: set sampler.sync = "lora" '
            '(sampler.sync = "merged" needs the in-process engine, sampler.urls = "")'
        )
    keep = config.train.max_off_policy_steps + 1
    return ServerPolicySampler(trainer, VllmServers(sampler.url_list), keep=keep)
