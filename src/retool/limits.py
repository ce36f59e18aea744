"""The numeric limits that a setting is checked against, one place for each.

The ground floor beside :mod:`retool.checks`: a bound the sandbox, the
reward workers or a training service enforces is also the bound the config
section checks (:mod:`retool.config`), so a value the leaf would refuse is
refused when the config is read, before anything starts. Keeping the numbers
here, below both, lets the config check them without depending on the code
that enforces them (the config imports no backend: a backend module pulls in
its service adapter), and lets each leaf import the very same number instead
of a copy that could drift. The leaves re-export what they use under their
own names (``retool.sandbox.limits.MAX_TIMEOUT_S``, ``retool.reward.
arguments.MAX_WORKERS``); the services' rank checks live here whole, message
and all, as config and the service clients both call them.

Each upper bound sits far above any real run: it exists because a larger
value is a typo that would crash or hang later (a timeout that overflows
``time_t``, a retry loop against a down service that never ends).
"""

from __future__ import annotations

from retool.errors import ConfigError

# The sandbox (every client: LocalSandbox, the SandboxFusion client, `retool sandbox`).
SANDBOX_MAX_TIMEOUT_S = 24 * 3600.0  # longest wall-clock limit of one call, seconds
# memory headroom of a call, MiB (below 16 MiB nothing runs)
SANDBOX_MEMORY_MB_RANGE = (16, 1 << 20)
SANDBOX_MAX_WORKERS = 256  # calls running at once, per sandbox
SANDBOX_MAX_OUTPUT_BYTES = 8 << 20  # tail kept of stdout and of stderr: a call writes at most this
# retries of a SandboxFusion call (more against a down service: a hang)
SANDBOX_MAX_REQUEST_RETRIES = 100

# The reward's verifier workers (retool.reward: its arguments and reward.*).
REWARD_MAX_TIMEOUT_S = 3600.0  # longest equivalence check, seconds
REWARD_MAX_WORKERS = 256  # verifier processes

# The LoRA ranks a training service accepts (model.lora_rank with model.backend).
# pytrio/client/service.py: ServiceClient._create_lora_training_client refuses
# `rank not in range(4, 65)` before any request.
PYTRIO_LORA_RANKS = range(4, 65)
# tinker/types/lora_config.py states no bound; the service refuses what it cannot serve.
TINKER_MIN_LORA_RANK = 1


def check_pytrio_rank(rank: int) -> None:
    """``model.lora_rank`` as PyTRIO's SDK checks it, refused before any request."""
    if rank not in PYTRIO_LORA_RANKS:
        raise ConfigError(
            f"model.lora_rank must be in [{PYTRIO_LORA_RANKS.start}, {PYTRIO_LORA_RANKS.stop - 1}] "
            f"on pytrio (a LoRA rank the service accepts), got {rank}"
        )


def check_tinker_rank(rank: int) -> None:
    """``model.lora_rank`` on Tinker: a LoRA adapter, so at least one."""
    if rank < TINKER_MIN_LORA_RANK:
        raise ConfigError(
            f"model.lora_rank must be >= {TINKER_MIN_LORA_RANK} on tinker (LoRA only), got {rank}"
        )
