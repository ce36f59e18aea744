"""A small fake of vLLM 0.32's OpenAI server on 127.0.0.1, for tests that need no vLLM.

It answers as ``vllm serve`` does (``completion/protocol.py``: ``CompletionResponse``;
``models/serving.py``: the adapter routes) and records every request.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeVllm:
    """A loopback HTTP server shaped like vllm serve; ``requests`` holds (path, body)."""

    def __init__(self, served: str = "base") -> None:
        self.requests: list[tuple[str, object]] = []
        self.adapters: dict[str, str] = {}
        self.served = served
        self.served_override: str | None = None  # the model name replies claim (a stale server)
        self.fail_next: list[int] = []  # HTTP statuses to answer next, in order
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: object, text: bool = False) -> None:
                data = (body if text else json.dumps(body)).encode()  # type: ignore[union-attr]
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.requests.append((self.path, None))
                if self.path == "/v1/models":
                    data = [{"id": fake.served, "parent": None, "max_model_len": 512, "root": "/m"}]
                    data += [
                        {"id": n, "parent": fake.served, "root": p}
                        for n, p in fake.adapters.items()
                    ]
                    self._reply(200, {"object": "list", "data": data})
                elif self.path == "/openapi.json":
                    self._reply(
                        200, {"paths": {"/v1/completions": {}, "/v1/load_lora_adapter": {}}}
                    )
                else:
                    self._reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, body))
                if fake.fail_next:
                    status = fake.fail_next.pop(0)
                    self._reply(status, {"error": {"message": f"failure {status}", "code": status}})
                elif self.path == "/v1/completions":
                    self._completion(body)
                elif self.path == "/v1/load_lora_adapter":
                    fake.adapters[body["lora_name"]] = body["lora_path"]
                    self._reply(200, f"Success: LoRA adapter '{body['lora_name']}' added", True)
                elif self.path == "/v1/unload_lora_adapter":
                    if fake.adapters.pop(body["lora_name"], None) is None:
                        self._reply(404, {"error": {"message": "cannot be found", "code": 404}})
                    else:
                        self._reply(200, "Success", True)
                else:
                    self._reply(404, {"detail": "Not Found"})

            def _completion(self, body: dict) -> None:
                model = body["model"]
                if model != fake.served and model not in fake.adapters:
                    self._reply(404, {"error": {"message": f"The model `{model}` does not exist."}})
                    return
                prompts = (
                    body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
                )
                choices = []
                for prompt in prompts:
                    for _ in range(body.get("n", 1)):
                        if body.get("prompt_logprobs") is not None:
                            entries = [None] + [
                                {str(t): {"logprob": -0.5 * i, "rank": 1}}
                                for i, t in enumerate(prompt[1:], 1)
                            ]
                        else:
                            entries = None
                        tokens = [len(choices) + 10, 7][: body["max_tokens"]]
                        choices.append(
                            {
                                "index": len(choices),
                                "text": "ignored",
                                "token_ids": tokens,
                                "logprobs": {
                                    "token_logprobs": [-1.0 - i for i in range(len(tokens))]
                                },
                                "finish_reason": "stop"
                                if 7 in body.get("stop_token_ids", [])
                                else "length",
                                "prompt_logprobs": entries,
                            }
                        )
                self._reply(200, {"model": fake.served_override or model, "choices": choices})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def completions(self) -> list[dict]:
        return [b for p, b in self.requests if p == "/v1/completions"]  # type: ignore[misc]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Tokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(f"t{i}" for i in ids)
