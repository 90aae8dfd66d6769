"""A scripted OpenAI-compatible HTTP server for tests: the one thing outside our control.

It speaks ``POST /v1/embeddings`` and ``POST /v1/chat/completions`` over real HTTP on a loopback
port. By default embeddings are deterministic (a vector derived from each input's hash) and chat
answers come from a handler; tests push scripted replies (status codes, delays, zero or non-finite
vectors, invalid JSON) that are served in order, and read back every request received.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from tests.support.loopback_http import LoopbackHTTP, send_json

__all__ = ["Reply", "ScriptedOpenAI", "hash_vector", "openai_provider"]


def hash_vector(text: str, dims: int) -> list[float]:
    """The server's default embedding: deterministic, unit length, unrelated texts near-orthogonal."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vec = np.random.default_rng(seed).normal(size=dims)
    return (vec / np.linalg.norm(vec)).tolist()


def openai_provider(server: Any, model: str, **extra: Any) -> dict[str, Any]:
    """A provider entry of kind ``openai`` (an embeddings provider or an auxiliary model) pointed at
    the scripted ``server``; ``extra`` adds or overrides its fields (``timeout_seconds``, ...)."""
    return {"kind": "openai", "base_url": server.base_url, "api_key": "k", "model": model, **extra}


@dataclass
class Reply:
    """One scripted answer. ``body`` None means the default answer for the request."""

    status: int = 200
    body: Any = None
    delay: float = 0.0
    raw: bytes | None = None
    content_type: str = "application/json"
    """The answer's content type: a proxy or captive portal in front of the endpoint answers 200
    ``text/html``, which the openai client hands back as a string rather than parsing it."""
    vectors: Callable[[list[str]], list[list[float]]] | None = None
    """For embeddings: compute the vectors from the inputs (zero vectors, NaNs, ...)."""
    hold: threading.Event | None = None
    """Do not answer until this event is set (a request held open: a check that is running)."""
    hold_timeout: float = 300.0
    """A held request is answered after this long anyway, so a forgotten hold cannot hang a test run."""


@dataclass
class _Script:
    queue: deque = field(default_factory=deque)
    rule: Callable[[dict], Reply | None] | None = None


class ScriptedOpenAI(LoopbackHTTP):
    def __init__(self, *, dims: int = 64, model: str = "scripted-embed"):
        self.dims = dims
        self.model = model
        self.requests: list[tuple[str, dict]] = []
        self.held = 0
        """Requests that were held open by a ``Reply(hold=...)``."""
        self._scripts = {"embeddings": _Script(), "chat": _Script()}
        self.chat_handler: Callable[[dict], str] = lambda body: "NOOP"
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -------------------------------------------------------------- scripting

    def push(self, kind: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts[kind].queue.extend(replies)

    def rule(self, kind: str, fn: Callable[[dict], Reply | None] | None) -> None:
        """A reply computed per request (consulted after the queue is empty); None = default."""
        with self._lock:
            self._scripts[kind].rule = fn

    def received(self, kind: str) -> list[dict]:
        path = "/v1/embeddings" if kind == "embeddings" else "/v1/chat/completions"
        with self._lock:
            return [body for p, body in self.requests if p == path]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    # -------------------------------------------------------------- serving

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ScriptedOpenAI:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                kind = "embeddings" if self.path.endswith("/embeddings") else "chat"
                with owner._lock:
                    owner.requests.append((self.path, body))
                    script = owner._scripts[kind]
                    reply = script.queue.popleft() if script.queue else None
                    rule = script.rule
                if reply is None and rule is not None:
                    reply = rule(body)
                reply = reply or Reply()
                if reply.hold is not None:
                    with owner._lock:
                        owner.held += 1
                    reply.hold.wait(reply.hold_timeout)
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.raw is not None:
                    payload = reply.raw
                elif reply.body is not None:
                    payload = json.dumps(reply.body).encode()
                elif reply.status != 200:
                    payload = json.dumps(
                        {"error": {"message": f"scripted {reply.status}", "type": "scripted"}}
                    ).encode()
                elif kind == "embeddings":
                    payload = owner._embeddings(body, reply)
                else:
                    payload = owner._chat(body)
                send_json(self, reply.status, payload, content_type=reply.content_type)

        self.serve_in_background(Handler)
        return self

    def _embeddings(self, body: dict, reply: Reply) -> bytes:
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        dims = body.get("dimensions") or self.dims
        vectors = reply.vectors(inputs) if reply.vectors else [hash_vector(t, dims) for t in inputs]
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        tokens = sum(max(1, len(t) // 4) for t in inputs)
        out = {
            "object": "list",
            "data": data,
            "model": body.get("model", self.model),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        # json.dumps writes NaN for non-finite floats, which the openai client parses back.
        return json.dumps(out).encode()

    def _chat(self, body: dict) -> bytes:
        text = self.chat_handler(body)
        prompt = sum(len(m.get("content") or "") for m in body.get("messages", [])) // 4 + 1
        completion = len(text) // 4 + 1
        out = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted-chat"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
        return json.dumps(out).encode()
