"""A fake PyTRIO service behind an ``httpx.MockTransport`` (see ``fakes.py``).

It answers the Control API (``/api/...``: key check, session, training and
sampling runs, checkpoint lookup) and the Actor API (``/v1/events`` in
msgpack, ``/v1/sampling-runs/<id>/sample`` in JSON) with the SDK's own
protocol models (``pytrio.protocol``), and models the trainer the adapter's
``model.loss_reduction = "active_token_mean"`` default assumes: each call's
summed loss divided by the ``total_active_tokens`` it was sent.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgpack
import numpy as np
from pytrio.protocol.actor.events.tensor import WireTensorData
from pytrio.protocol.actor.events.trainer.forward import TrainerForwardBackwardPayload
from pytrio.protocol.actor.sampling_run.sample import SampleRequest

from tests.backends.remote.fakes import Faults, Policy, install_transport

API_KEY = "trio-test-key"
FAR = "2099-01-01T00:00:00Z"
NOW = "2026-01-01T00:00:00Z"


@dataclass
class Run:
    """One training run on the fake service."""

    cuid: str
    base_model: str
    rank: int
    seed: int | None
    source: str = ""  # checkpoint it was created from
    restore_optimizer: bool = False
    optimizer_steps: int = 0


@dataclass
class FakePytrio:
    model_id: str  # what Control resolves every base model to (a local tokenizer dir)
    max_seq_len: int = 512
    faults: Faults = field(default_factory=Faults)
    runs: dict[str, Run] = field(default_factory=dict)
    checkpoints: dict[str, tuple[Run, int]] = field(default_factory=dict)  # uri -> (run, steps)
    forward_payloads: list[TrainerForwardBackwardPayload] = field(default_factory=list)
    objectives: list[float] = field(default_factory=list)  # what each forward_backward minimised
    gradients: list[np.ndarray] = field(default_factory=list)  # d objective / d logprob
    sample_requests: list[SampleRequest] = field(default_factory=list)
    optimize_payloads: list[dict] = field(default_factory=list)
    init_payloads: list[dict] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # trainer events, in the order they arrived
    seen_keys: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- transport -----------------------------------------------------------------------
    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            path = request.url.path
            if (injected := self.faults.take(path)) is not None:
                return injected
            if path.startswith("/api/telemetry"):
                return httpx.Response(204)
            if path.startswith("/api/"):
                key = request.headers.get("x-api-key", "")
                self.seen_keys.add(key)
                if key != API_KEY:
                    return httpx.Response(401, json={"code": "unauthorized", "message": "bad key"})
                return self.control(request, path[len("/api/") :])
            return self.actor(request, path)

    # -- Control ---------------------------------------------------------------------------
    def control(self, request: httpx.Request, path: str) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if path == "openapi/v1/api-key/verify":
            return httpx.Response(
                200,
                json={
                    "api_key_tid": "k1",
                    "api_key_name": None,
                    "user_cuid": "u1",
                    "username": "tester",
                    "display_name": None,
                    "workspace_cuid": "w1",
                    "workspace_name": "test",
                    "workspace_type": "personal",
                    "expires_at": None,
                },
            )
        if path == "sdk/bootstrap":
            version = request.url.params.get("sdk_version", "")
            return httpx.Response(
                200,
                json={
                    "compatibility": {"status": "compatible", "sdk_version": version},
                    "notices": [],
                },
            )
        parts = path.split("/")
        if path == "openapi/v1/service-sessions":
            return httpx.Response(
                200,
                json={
                    "service_session_cuid": "s1",
                    "workspace_cuid": "w1",
                    "status": "ACTIVE",
                    "created_at": NOW,
                },
            )
        if path.endswith("/training-runs") and request.method == "POST":
            source = body.get("source_checkpoint_uri", "")
            if source:
                origin, _ = self.checkpoints[source]
                base, rank = origin.base_model, body["lora_rank"]
            else:
                base, rank = body["base_model"], body["lora_rank"]
            run = Run(
                f"tr{len(self.runs) + 1}",
                base,
                rank,
                body.get("seed"),
                source,
                bool(body.get("restore_optimizer")),
            )
            if source and run.restore_optimizer:
                run.optimizer_steps = self.checkpoints[source][1]
            self.runs[run.cuid] = run
            return httpx.Response(200, json=self.run_created(run, "training_run_cuid", "trainer"))
        if path == "openapi/v1/training-runs/by-checkpoint-uri":
            uri = request.url.params["checkpoint_uri"]
            if uri not in self.checkpoints:
                return httpx.Response(404, json={"code": "not_found", "message": uri})
            run, _ = self.checkpoints[uri]
            return httpx.Response(
                200,
                json={
                    "base_model": run.base_model,
                    "lora_rank": run.rank,
                    "seed": run.seed,
                    "train_mlp": True,
                    "train_attn": True,
                    "train_unembed": True,
                },
            )
        if path.endswith("/sampling-runs") and request.method == "POST":
            run = Run(f"sr{len(self.runs) + 1}", body["base_model"], 0, None)
            run.source = body.get("source_checkpoint_uri", "")
            self.runs[run.cuid] = run
            return httpx.Response(200, json=self.run_created(run, "sampling_run_cuid", "sampler"))
        if parts[-1] in ("renew", "close"):
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"code": "not_found", "message": path})

    def run_created(self, run: Run, id_field: str, capability: str) -> dict[str, Any]:
        return {
            id_field: run.cuid,
            "service_session_cuid": "s1",
            "workspace_cuid": "w1",
            "status": "ACTIVE",
            "run_index": len(self.runs),
            "model_spec_cuid": "m1",
            "model_alias": run.base_model,
            "model_id": self.model_id,
            capability: {
                "max_batch_size": 64,
                "max_tokens_per_request": 65536,
                "max_seq_len": self.max_seq_len,
            },
            "actor": {
                "actor_cuid": "a1",
                "endpoint": f"actor-{run.cuid}.test",
                "connect_mode": "direct",
                "tls_enabled": False,
            },
            "actor_jwt": {"token": f"jwt-{run.cuid}", "expires_at": FAR},
            "created_at": NOW,
        }

    # -- Actor -----------------------------------------------------------------------------
    def actor(self, request: httpx.Request, path: str) -> httpx.Response:
        run_cuid = request.url.host.removeprefix("actor-").removesuffix(".test")
        if request.headers.get("authorization") != f"Bearer jwt-{run_cuid}":
            return httpx.Response(401, json={"code": "unauthorized", "message": "bad jwt"})
        if path == "/v1/client/heartbeat":
            return httpx.Response(200, json={"heartbeat_ms": 60000})
        if path == "/v1/events":
            envelope = msgpack.unpackb(request.content, raw=False)
            result = self.event(self.runs[run_cuid], envelope["type"], envelope["payload"])
            response = {
                "version": 1,
                "event_id": envelope["event_id"],
                "type": envelope["type"],
                "status": "succeeded",
                "result": result,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
            return httpx.Response(
                200,
                content=msgpack.packb(response, use_bin_type=True),
                headers={"content-type": "application/msgpack"},
            )
        if path.endswith("/sample"):
            sample = SampleRequest.model_validate(json.loads(request.content))
            self.sample_requests.append(sample)
            return httpx.Response(200, json=self.sample(sample))
        return httpx.Response(404, json={"code": "not_found", "message": path})

    def event(self, run: Run, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(kind.removeprefix("trainer."))
        if kind == "trainer.init_run":
            self.init_payloads.append(payload)
            return {}
        if kind in ("trainer.forward_backward", "trainer.forward"):
            return self.forward(TrainerForwardBackwardPayload.model_validate(payload))
        if kind == "trainer.optimize_step":
            self.optimize_payloads.append(payload)
            run.optimizer_steps += 1
            return {"metrics": {"grad_norm": 0.5, "optimizer_steps": float(run.optimizer_steps)}}
        if kind in ("trainer.save_state", "trainer.save_weights"):
            folder = "state" if kind.endswith("state") else "sampler"
            uri = f"trio://{run.cuid}/{folder}/{payload['name']}"
            self.checkpoints[uri] = (run, run.optimizer_steps)
            return {"checkpoint": {"uri": uri, "model_id": self.model_id, "size_bytes": 10}}
        raise AssertionError(kind)

    def forward(self, payload: TrainerForwardBackwardPayload) -> dict[str, Any]:
        self.forward_payloads.append(payload)
        config = dict(payload.loss.config)
        outputs, total, grads = [], 0.0, []
        for datum in payload.data:
            old = np.asarray(datum.logprobs or [0.0] * len(datum.target_ids), dtype=np.float64)
            current = Policy.current(old)
            inputs = {
                "weights": np.asarray(datum.weights or [], dtype=np.float64),
                "logprobs": old,
                "advantages": np.asarray(datum.advantages or [], dtype=np.float64),
            }
            losses, grad = Policy.losses(payload.loss.type, inputs, current, config)
            total += float(losses.sum())
            grads.append(grad)
            outputs.append(
                {"logprobs": WireTensorData.from_numpy(current.astype(np.float32)).to_wire_value()}
            )
        count = payload.gradient_accumulation.total_active_tokens
        self.objectives.append(total / max(count, 1))
        self.gradients.append(np.concatenate(grads) / max(count, 1))
        metrics = {"loss_sum": total, "loss_mean": total / max(count, 1), "token_count": count}
        return {"loss_fn_outputs": outputs, "metrics": metrics}

    def sample(self, request: SampleRequest) -> dict[str, Any]:
        prompt = [t for chunk in request.prompt.chunks for t in chunk.tokens]
        params = request.sampling_params
        sequences = []
        for tokens, logprobs, stopped in Policy.sample(
            prompt, request.num_samples, int(params["max_tokens"]), params.get("seed")
        ):
            sequences.append(
                {
                    "tokens": tokens,
                    "text": " ".join(f"w{t}" for t in tokens if t > 1),
                    "logprobs": logprobs,
                    "stop_reason": "stop" if stopped else "length",
                }
            )
        prompt_logprobs = [None] + [-0.5] * (len(prompt) - 1)
        return {
            "request_id": request.request_id,
            "sequences": sequences,
            "prompt_logprobs": prompt_logprobs if request.return_prompt_logprobs else None,
            "usage": {"input_tokens": len(prompt), "output_tokens": 0},
        }


def use_fake_pytrio(monkeypatch, home, tokenizer_dir, delay: float = 0.0) -> FakePytrio:
    """A fake PyTRIO service, and the SDK logged in to it as `trio login` would
    (``delay``: see ``install_transport``). The caller turns the SDK's observability
    off and back on (``pytrio.configure_observability``)."""
    import sys

    from pytrio.config.config import auth_state, configuration

    fake = FakePytrio(model_id=str(tokenizer_dir))
    install_transport(monkeypatch, fake, delay)
    monkeypatch.setattr(auth_state, "api_key", API_KEY)
    monkeypatch.setattr(auth_state, "config_error", None)
    monkeypatch.setattr(configuration, "home", str(home))
    monkeypatch.setattr(configuration, "retry_initial_delay_seconds", 0.01)
    monkeypatch.setattr(configuration, "retry_jitter_ratio", 0.0)
    monkeypatch.setattr(configuration, "log_level", "ERROR")
    monkeypatch.delenv("PYTRIO_API_KEY", raising=False)
    # The SDK loads tokenizers with ModelScope when it can and falls back to
    # transformers (pytrio/model/tokenizer.py); importing ModelScope takes seconds.
    monkeypatch.setitem(sys.modules, "modelscope", None)
    return fake
