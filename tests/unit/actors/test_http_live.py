"""Live calls on aiohttp: what the providers get is what a live httpx call gives them
(a decoded ``httpx.Response``, httpx's exceptions), and the environment's proxies apply."""

from __future__ import annotations

import base64
import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from graphrun.actors.llm.client import ClientFactory, _env_proxy
from graphrun.actors.llm.config import load_llm_config
from graphrun.actors.llm.providers import get_provider
from graphrun.actors.llm.providers.base import ChatRequest, LlmCallError

REQUEST = ChatRequest(model="openai:gpt-test", messages=[{"role": "user", "content": "q"}])


class _Gzipped(BaseHTTPRequestHandler):
    """Answers every POST with a gzip-compressed chat completion; a path ending in
    ``/drop`` closes the connection without an answer."""

    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        _Gzipped.seen.append((self.path, self.headers.get("authorization")))
        if self.path.endswith("/drop/chat/completions"):
            self.close_connection = True
            return
        if self.path.endswith("/busy/chat/completions"):  # uncompressed, no body
            self.send_response(503)
            self.send_header("retry-after", "7")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        body = {
            "id": "c",
            "object": "chat.completion",
            "model": "gpt-test",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "zipped"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = gzip.compress(json.dumps(body).encode())
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-encoding", "gzip")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def gzip_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gzipped)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _call(base_url: str) -> str:
    config = load_llm_config(None, env={"OPENAI_BASE_URL": base_url})
    with ClientFactory(config) as factory:
        resolved = factory.resolve(REQUEST.model)
        client = factory.client(resolved.base_url)
        return get_provider(resolved.provider).call(client, resolved, REQUEST).text


def test_a_compressed_body_is_decoded_by_httpx(gzip_server: str) -> None:
    assert _call(f"{gzip_server}/v1") == "zipped"


def test_an_uncompressed_answer_reads_as_httpx_reads_it(gzip_server: str) -> None:
    # Its status line's reason and its headers, as a failure's message and retry need them.
    with pytest.raises(LlmCallError) as caught:
        _call(f"{gzip_server}/busy")
    assert caught.value.message.endswith("/busy/chat/completions: Service Unavailable")
    assert (caught.value.status, caught.value.retry_after) == (503, 7.0)


def test_user_info_in_the_base_url_is_sent_as_basic_auth_as_httpx_sends_it(
    gzip_server: str,
) -> None:
    assert _call(gzip_server.replace("http://", "http://me:p%40ss@") + "/v1") == "zipped"
    path, auth = _Gzipped.seen[-1]
    assert path == "/v1/chat/completions"
    assert auth == "Basic " + base64.b64encode(b"me:p@ss").decode()


def test_a_dropped_connection_is_a_transport_error(gzip_server: str) -> None:
    with pytest.raises(LlmCallError) as caught:
        _call(f"{gzip_server}/drop")
    assert "failed" in caught.value.message or "could not reach" in caught.value.message


def test_proxies_are_read_as_httpx_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    assert _env_proxy("https", "api.example.com") == {}
    monkeypatch.setenv("ALL_PROXY", "http://proxy.local:3128")
    assert _env_proxy("https", "api.example.com") == {"proxy": "http://proxy.local:3128"}
    monkeypatch.setenv("HTTPS_PROXY", "http://user:s%40cret@secure.local:8080")
    found = _env_proxy("https", "api.example.com")
    assert found["proxy"] == "http://secure.local:8080"
    auth = base64.b64encode(b"user:s@cret").decode()
    assert found["proxy_headers"] == {"Proxy-Authorization": f"Basic {auth}"}
    monkeypatch.setenv("NO_PROXY", "example.com")
    assert _env_proxy("https", "api.example.com") == {}
    assert _env_proxy("http", "other.org") == {"proxy": "http://proxy.local:3128"}
