"""A small real HTTP server standing in for an engine's operator endpoints, recording calls.

It answers the contract the admin is written against (see registry/engines.py): POST
/v1/pin_lora_adapter and /v1/unpin_lora_adapter, GET /v1/lora_adapters, GET /metrics (the
exposition is rendered by the serving layer's own collector from an engine-shaped stats
dict, so the metric names are the real ones).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest

from inference.metrics import EngineCollector

STATS = {
    "requests_running": 3,
    "requests_waiting": 1,
    "kv_blocks_used": 30,
    "kv_blocks_total": 120,
    "prompt_tokens": 4000,
    "generation_tokens": 900,
    "preemptions": 2,
    "finished": {"stop": 10, "length": 1, "abort": 0},
    "lora": {
        "lookups": {"device": 40, "host": 8, "disk": 2},
        "hits": {"device": 30, "host": 6, "disk": 2, "loader": 0},
        "slots_used": 2,
        "slots_total": 8,
        "adapters_waiting": 1,
        "running_adapters": ["tenant-a/support-bot:1"],
        "waiting_adapter_names": ["tenant-a/other:2"],
        "running_model_names": ["support-bot"],
        "waiting_model_names": ["other@canary"],
    },
}
MODEL_NAME = "tiny-base"  # the base model the stand-in engine serves
ADAPTERS = [
    {"name": "tenant-a/support-bot:1", "tier": "device", "slot": 0, "pinned": True, "rank": 4},
    {"name": "tenant-a/other:2", "tier": "host", "slot": None, "pinned": False, "rank": 8},
]


@dataclass
class Call:
    method: str
    path: str
    authorization: str | None
    body: dict | None


@dataclass
class Recorder:
    url: str
    calls: list[Call] = field(default_factory=list)
    refuse: dict[str, tuple[int, str]] = field(default_factory=dict)  # lora_name -> answer


def metrics_text() -> bytes:
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: STATS, lambda: MODEL_NAME))
    return generate_latest(registry)


def start_recorder() -> tuple[Recorder, ThreadingHTTPServer]:
    recorder = Recorder(url="")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status: int, body: bytes, content_type="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _record(self, body=None):
            recorder.calls.append(
                Call(self.command, self.path, self.headers.get("Authorization"), body)
            )

        def do_GET(self):
            self._record()
            if self.path == "/v1/lora_adapters":
                self._answer(200, json.dumps({"object": "list", "data": ADAPTERS}).encode())
            elif self.path == "/metrics":
                self._answer(200, metrics_text(), "text/plain; version=0.0.4")
            else:
                self._answer(404, b'{"error": {"message": "no such path"}}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._record(body)
            if body.get("lora_name") in recorder.refuse:
                status, message = recorder.refuse[body["lora_name"]]
                self._answer(status, json.dumps({"error": {"message": message}}).encode())
            else:
                self._answer(
                    200, json.dumps({"lora_name": body["lora_name"], "status": "ok"}).encode()
                )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return recorder, server
