"""A real HTTP server on 127.0.0.1 that speaks the OpenAI and Anthropic chat APIs.

It answers ``POST /v1/chat/completions`` (OpenAI Chat Completions),
``POST /v1/messages`` (Anthropic Messages) and ``POST /v1/embeddings`` (OpenAI
embeddings: :attr:`FakeLlm.embedding_dim`-sized vectors of the offline hash
embedder, after :attr:`FakeLlm.embedding_delay`, or :attr:`FakeLlm.embedding_reply`
instead), records every request (path,
headers, JSON body) and replies from a script the test sets, in order, whatever
the protocol; with the script empty it echoes the last user message
(``"echo: <text>"``), or calls :attr:`FakeLlm.default` if set::

    def test_something(fake_llm):
        fake_llm.script(fake_llm_error(429, retry_after=0), fake_llm_text("hi"))
        ... OPENAI_BASE_URL=fake_llm.url_openai / ANTHROPIC_BASE_URL=fake_llm.url_anthropic
        assert fake_llm.requests[0].body["model"] == "gpt-test"

Replies: :func:`text`, :func:`tool_calls`, :func:`http_error`, :func:`raw`
(any body text, e.g. malformed JSON), each with an optional ``delay`` (seconds
before answering; for timeouts). Use it as the ``fake_llm`` pytest fixture (this
module is a pytest plugin) or as a context manager.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass(frozen=True)
class FakeToolCall:
    """A tool call the fake model makes."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``raw`` (if set) is sent as the body verbatim."""

    text: str | None = None
    tool_calls: tuple[FakeToolCall, ...] = ()
    status: int = 200
    error_message: str | None = None
    error_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    raw: str | None = None
    usage: dict[str, int] | None = None


def text(value: str, *, delay: float = 0.0, usage: dict[str, int] | None = None) -> Reply:
    """An assistant reply with text ``value``."""
    return Reply(text=value, delay=delay, usage=usage)


def tool_calls(*calls: FakeToolCall | tuple[str, dict[str, Any]], text: str = "") -> Reply:
    """An assistant turn asking for tools: ``FakeToolCall``s or ``(name, arguments)`` pairs."""
    made = tuple(
        call if isinstance(call, FakeToolCall) else FakeToolCall(call[0], call[1]) for call in calls
    )
    return Reply(text=text or None, tool_calls=made)


def http_error(
    status: int,
    message: str | None = None,
    *,
    error_type: str | None = None,
    retry_after: float | str | None = None,
    delay: float = 0.0,
) -> Reply:
    """An error response in the protocol's own error shape."""
    headers = {"retry-after": _retry_after_text(retry_after)} if retry_after is not None else {}
    return Reply(
        status=status,
        error_message=message or f"fake error {status}",
        error_type=error_type,
        headers=headers,
        delay=delay,
    )


def raw(body: str, *, status: int = 200, content_type: str = "application/json") -> Reply:
    """A response whose body is ``body`` exactly (e.g. malformed JSON)."""
    return Reply(status=status, raw=body, headers={"content-type": content_type})


def _retry_after_text(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received; header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    peer: str = ""  # the client's address and port: which connection it came over

    @property
    def protocol(self) -> str:
        """``"anthropic"`` or ``"openai"``, from the path."""
        return "anthropic" if self.path.endswith("/messages") else "openai"


class FakeLlm:
    """The server. Start it with ``with FakeLlm() as fake:`` (or :meth:`start`)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        #: Served over TLS with this server-side context (``https://`` URLs), if given.
        self.tls = tls
        self.requests: list[RecordedRequest] = []
        #: Called for a request when the script is empty; returns the reply.
        self.default: Callable[[RecordedRequest], Reply] | None = None
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        #: ``/embeddings``: the vectors' size (``local:hash-<dim>``'s vectors, so
        #: retrieval through the server ranks as the offline embedder does).
        self.embedding_dim = 64
        #: ``/embeddings``: seconds before each answer.
        self.embedding_delay = 0.0
        #: ``/embeddings``: a reply (:func:`http_error`, :func:`raw`) sent instead of vectors.
        self.embedding_reply: Reply | None = None
        #: ``/embeddings`` requests being answered now, and the most there were at once.
        self.embeddings_in_flight = 0
        self.embeddings_in_flight_max = 0
        #: ``/embeddings`` requests whose client closed the connection during the delay.
        self.embeddings_abandoned = 0

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> FakeLlm:
        """Bind 127.0.0.1 on a free port and serve in a background thread."""
        handler = type("_Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},  # shutdown() waits up to one poll
            name="fake-llm",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port (delayed replies are cut short)."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLlm:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "the fake LLM server is not running"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (``https://`` when served over TLS)."""
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def url_openai(self) -> str:
        """The OpenAI base URL (ends with ``/v1``, like ``OPENAI_BASE_URL``)."""
        return f"{self.url}/v1"

    @property
    def url_anthropic(self) -> str:
        """The Anthropic base URL (no ``/v1``, like ``ANTHROPIC_BASE_URL``)."""
        return self.url

    # --- scripting ------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue ``replies``; each request takes the next one."""
        with self._lock:
            self._script.extend(replies)

    def reset(self) -> None:
        """Forget the script and the recorded requests."""
        with self._lock:
            self._script.clear()
            self.requests.clear()

    @property
    def pending(self) -> int:
        """How many scripted replies are still unused."""
        with self._lock:
            return len(self._script)

    def _next_reply(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._script:
                return self._script.popleft()
        if self.default is not None:
            return self.default(request)
        return text(f"echo: {last_user_text(request.body)}")

    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; False if the server is stopping."""
        return not self._stopping.wait(seconds)

    def _next_id(self) -> int:
        return next(self._ids)


def last_user_text(body: Any) -> str:
    """The text of the last user message in an OpenAI or Anthropic request body."""
    if not isinstance(body, dict):
        return ""
    for message in reversed(body.get("messages") or []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        parts = []
        for block in content or []:
            if block.get("type") == "text":
                parts.append(block.get("text", ""))
            elif block.get("type") == "tool_result":
                parts.append(str(block.get("content", "")))
        return "".join(parts)
    return ""


# --- rendering replies in each protocol ---------------------------------------


def _usage_counts(reply: Reply, body: Any) -> tuple[int, int]:
    if reply.usage:
        return reply.usage.get("input", 0), reply.usage.get("output", 0)
    prompt = len(json.dumps(body.get("messages", []) if isinstance(body, dict) else []).split())
    return prompt, len((reply.text or "").split()) + len(reply.tool_calls)


def _arguments_text(call: FakeToolCall) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


def _openai_body(fake: FakeLlm, reply: Reply, body: Any) -> dict[str, Any]:
    n = fake._next_id()
    if reply.status >= 400:
        kind = reply.error_type or _openai_error_type(reply.status)
        return {
            "error": {"message": reply.error_message, "type": kind, "param": None, "code": kind}
        }
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id or f"call_{n}_{index}",
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments_text(call)},
            }
            for index, call in enumerate(reply.tool_calls)
        ]
    prompt, completion = _usage_counts(reply, body)
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "") if isinstance(body, dict) else "",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _anthropic_body(fake: FakeLlm, reply: Reply, body: Any) -> dict[str, Any]:
    n = fake._next_id()
    if reply.status >= 400:
        kind = reply.error_type or _anthropic_error_type(reply.status)
        return {"type": "error", "error": {"type": kind, "message": reply.error_message}}
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for index, call in enumerate(reply.tool_calls):
        arguments = (
            call.arguments if isinstance(call.arguments, dict) else json.loads(call.arguments)
        )
        content.append(
            {
                "type": "tool_use",
                "id": call.id or f"toolu_{n}_{index}",
                "name": call.name,
                "input": arguments,
            }
        )
    prompt, completion = _usage_counts(reply, body)
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "") if isinstance(body, dict) else "",
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    }


def _openai_error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "invalid_api_key",
        404: "model_not_found",
        429: "rate_limit_exceeded",
    }.get(status, "server_error")


def _anthropic_error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error")


class _Handler(BaseHTTPRequestHandler):
    fake: FakeLlm
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body are two writes; without this, Nagle + delayed ACK add ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        payload = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(payload) if payload else None
        except ValueError:
            body = payload.decode("utf-8", "replace")
        request = RecordedRequest(
            method="POST",
            path=self.path,
            headers={key.lower(): value for key, value in self.headers.items()},
            body=body,
            peer=f"{self.client_address[0]}:{self.client_address[1]}",
        )
        if self.path.endswith("/chat/completions"):
            render = _openai_body
        elif self.path.endswith("/v1/messages"):
            render = _anthropic_body
        elif self.path.endswith("/embeddings"):
            self._embeddings(request)
            return
        else:
            with self.fake._lock:
                self.fake.requests.append(request)
            self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}), {})
            return
        reply = self.fake._next_reply(request)
        if reply.delay and not self.fake._wait(reply.delay):
            self.close_connection = True  # stopping: answer nothing
            return
        content = reply.raw if reply.raw is not None else json.dumps(render(self.fake, reply, body))
        self._send(reply.status, content, reply.headers)

    def _embeddings(self, request: RecordedRequest) -> None:
        fake = self.fake
        with fake._lock:
            fake.requests.append(request)
            fake.embeddings_in_flight += 1
            fake.embeddings_in_flight_max = max(
                fake.embeddings_in_flight_max, fake.embeddings_in_flight
            )
        try:
            if fake.embedding_delay and not self._wait_watching(fake.embedding_delay):
                self.close_connection = True  # stopping, or the client left: answer nothing
                return
            reply = fake.embedding_reply
            if reply is not None:
                content = reply.raw
                if content is None:
                    content = json.dumps(_openai_body(fake, reply, request.body))
                self._send(reply.status, content, reply.headers)
                return
            from graphrun.actors.rag.embed import HashEmbedder

            inputs = request.body["input"]
            vectors = HashEmbedder(fake.embedding_dim).embed(inputs).tolist()
            data = [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ]
            model = request.body["model"]
            self._send(200, json.dumps({"object": "list", "data": data, "model": model}), {})
        finally:
            with fake._lock:
                fake.embeddings_in_flight -= 1

    def _wait_watching(self, seconds: float) -> bool:
        """Sleep ``seconds`` watching the connection; False if the server is stopping
        or the client closed the connection meanwhile (counted as abandoned)."""
        fake = self.fake
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if fake._stopping.is_set():
                return False
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.05))
            if readable:
                try:
                    gone = not self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    gone = True
                if gone:
                    with fake._lock:
                        fake.embeddings_abandoned += 1
                    return False
                fake._wait(min(left, 0.05))  # more bytes, not a hang-up: keep waiting
        return True

    def _send(self, status: int, content: str, headers: dict[str, str]) -> None:
        data = content.encode("utf-8")
        try:
            self.send_response(status)
            lowered = {key.lower() for key in headers}
            if "content-type" not in lowered:
                self.send_header("content-type", "application/json")
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout or cancellation under test)


@pytest.fixture
def fake_llm() -> Iterator[FakeLlm]:
    """A running :class:`FakeLlm`; sets no environment variables."""
    with FakeLlm() as server:
        yield server


__all__ = [
    "FakeLlm",
    "FakeToolCall",
    "RecordedRequest",
    "Reply",
    "fake_llm",
    "http_error",
    "last_user_text",
    "raw",
    "text",
    "tool_calls",
]


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.fake_llm --reply TEXT [--url-file FILE]``: serve one
    reply to every chat request until stopped (a local OpenAI-compatible stand-in
    for the docs' tutorial); the base URL is printed (and written to FILE)."""
    import argparse
    import signal
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m tests.support.fake_llm")
    parser.add_argument("--reply", default="ok", help="The text every request gets.")
    parser.add_argument("--url-file", help="Write the OpenAI base URL here once serving.")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FakeLlm() as fake:
        fake.default = lambda request: text(args.reply)
        print(fake.url_openai, flush=True)
        if args.url_file:
            Path(args.url_file).write_text(fake.url_openai, encoding="utf-8")
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
