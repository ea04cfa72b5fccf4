"""The one seam LLM calls go through: pooled httpx clients, live or replaying.

:class:`ClientFactory` hands out one client per base URL (connections are
reused across nodes and turns) and resolves model ids. The client is either live
or a :class:`ReplayClient` answering from a :class:`ReplayTransport` of recorded
``LlmCalled`` events, so replay swaps the seam, not the code that calls it.

Live calls can be aborted from another thread: :meth:`ClientFactory.abort_on`
ties the calling thread's in-flight request to a :class:`CancelToken`; when the
token fires, the socket the request is using is shut down, so the request fails
at once instead of waiting for the model to finish (and the server stops
generating tokens nobody will read).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from graphrun.actors.base import CancelToken
from graphrun.actors.llmconfig import LlmConfig, LlmConfigError, ResolvedModel, load_llm_config
from graphrun.actors.providers.base import RetryPolicy
from graphrun.eventstore.errors import GraphrunError
from graphrun.eventstore.events import LlmCalled

if TYPE_CHECKING:
    import httpx

#: Seconds to wait for a TCP (and TLS) connection.
CONNECT_TIMEOUT = 10.0
#: Seconds to wait for a response when the node has no timeout (models can be slow).
READ_TIMEOUT = 600.0


class LlmReplayMissError(GraphrunError):
    """A replayed run made an LLM request that the recording does not have."""


def canonical_json(value: Any) -> str:
    """One text per JSON value: sorted keys, no spaces (how requests are matched)."""
    return _canonical_bytes(value).decode("utf-8")


_canonical_bytes = msgspec.json.Encoder(order="sorted").encode


class ClientFactory:
    """Pooled httpx clients per base URL, model resolution, and request aborts.

    Args:
        config: The LLM clients; ``None`` loads the built-in ones from the environment.
        recording: Recorded calls to answer every call from instead of the network
            (see :meth:`replay`).
        retry: Waits between attempts of transient failures.
        connect_timeout: Seconds to connect.
        read_timeout: Seconds to wait for a response when the call has no budget.
    """

    def __init__(
        self,
        config: LlmConfig | None = None,
        *,
        recording: ReplayTransport | None = None,
        retry: RetryPolicy | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.config = config if config is not None else load_llm_config(None)
        self.retry = retry if retry is not None else RetryPolicy()
        self._recording = recording
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._clients: dict[str, httpx.Client] = {}
        self._lock = threading.Lock()
        self._aborts = _AbortRegistry()
        self._resolved: dict[str, ResolvedModel] = {}

    @classmethod
    def replay(cls, events: Iterable[LlmCalled], config: LlmConfig | None = None) -> ClientFactory:
        """A factory whose every call is answered from ``events`` (no network, no waits)."""
        recorded = [event for event in events if isinstance(event, LlmCalled)]
        return cls(
            config,
            recording=ReplayTransport(recorded),
            retry=RetryPolicy(base_delay=0.0, max_delay=0.0, retry_after_cap=0.0),
        )

    @property
    def replaying(self) -> bool:
        """Whether calls are served from a recording."""
        return self._recording is not None

    def resolve(self, model_id: str) -> ResolvedModel:
        """Resolve ``model_id`` (once per factory: its configuration is loaded once
        too); when replaying, a client unknown here is taken from the recording
        (the machine replaying need not have its config)."""
        known = self._resolved.get(model_id)
        if known is not None:
            return known
        try:
            resolved = self.config.resolve(model_id)
        except LlmConfigError:
            if self._recording is None:
                raise
            recorded = self._recording.resolve(model_id)
            if recorded is None:
                raise
            resolved = recorded
        self._resolved[model_id] = resolved
        return resolved

    def client(self, base_url: str) -> httpx.Client:
        """The shared client for ``base_url`` (created on first use): an object with
        httpx's ``post(url, content=, headers=, timeout=)`` and ``close()``.

        Live, a :class:`_LeanClient` over an ``httpx.Client`` (see there). When
        replaying, a :class:`ReplayClient` answers without building HTTP
        requests at all: nothing leaves the process, and a replayed call costs
        microseconds rather than a trip through httpx's request machinery.
        """
        with self._lock:
            existing = self._clients.get(base_url)
            if existing is not None:
                return existing
            if self._recording is not None:
                replay: Any = ReplayClient(self._recording)
                self._clients[base_url] = replay
                return replay  # type: ignore[no-any-return]
            import httpx

            # No transport passed in, so that httpx mounts the proxies the environment
            # names (HTTP(S)_PROXY, ALL_PROXY, NO_PROXY): it does not for a client given
            # its transport. Retries are httpx's default, none: ours are counted,
            # recorded, and only for transient errors.
            created = httpx.Client(
                verify=shared_ssl_context(),
                # No connection cap and every connection kept alive: a step's branches
                # never queue for a connection. httpcore's sync pool can close a
                # connection it has just handed to a queued request, which then hangs
                # until its read timeout (encode/httpcore#1110); with nothing queued
                # and no surplus keep-alive to trim, that cannot happen.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
                timeout=httpx.Timeout(self._read_timeout, connect=self._connect_timeout),
                follow_redirects=False,
                trust_env=True,
            )
            mounted = getattr(created, "_mounts", {}).values()
            for transport in (getattr(created, "_transport", None), *mounted):
                self._make_abortable(transport)
            lean: Any = _LeanClient(created)
            self._clients[base_url] = lean
            return lean  # type: ignore[no-any-return]

    def abort_on(self, token: CancelToken) -> contextlib.AbstractContextManager[None]:
        """While in this block, ``token`` firing aborts this thread's in-flight request."""
        if self._recording is not None:
            return _NOTHING_TO_ABORT  # a replayed call never waits on anything
        return _AbortScope(token, self._aborts)

    def close(self) -> None:
        """Close every pooled client."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def __enter__(self) -> ClientFactory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _make_abortable(self, transport: Any) -> None:
        """Let :meth:`abort_on` shut down the sockets of ``transport``'s pool.

        httpx has no public hook for the network backend; wrapping the pool's
        backend is what lets a cancellation shut down the socket in use. If a
        future httpx moves it, calls still work and are stopped by their timeout.
        """
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is not None:
            pool._network_backend = _AbortableBackend(backend, self._aborts)  # type: ignore[union-attr]


_CLIENT_DEFAULT: Any = object()  # httpx's USE_CLIENT_DEFAULT, without importing httpx


class _LeanClient:
    """POSTs through the pooled transport an ``httpx.Client`` would pick, with the
    client's headers and timeout, but without its per-request machinery.

    An LLM API needs none of that machinery: no cookie jar (``extract_cookies`` ran
    on every response), no redirects (not followed anyway), no auth flow (the key
    is a header). Skipping it also leaves no reference cycle behind:
    ``Client.send`` ties each response to its stream both ways, so every call
    left ~46 objects for the cyclic collector, whose passes then cost ~2 ms each.
    Proxies from the environment still apply: the transport is chosen by the
    client's own rules (its private ``_transport_for_url``; should a future httpx
    drop it, calls go through ``Client.post`` as before).
    """

    __slots__ = ("_client", "_pick")

    replaying = False

    def __init__(self, client: httpx.Client) -> None:
        self._client = client
        self._pick = getattr(client, "_transport_for_url", None)

    def post(
        self, url: str, *, content: bytes, headers: Any = None, timeout: Any = _CLIENT_DEFAULT
    ) -> httpx.Response:
        import httpx

        if timeout is _CLIENT_DEFAULT:
            timeout = httpx.USE_CLIENT_DEFAULT
        client = self._client
        if self._pick is None:
            return client.post(url, content=content, headers=headers, timeout=timeout)
        merged = client.headers.copy()
        if headers:
            merged.update(headers)
        timeout = client.timeout if timeout is httpx.USE_CLIENT_DEFAULT else httpx.Timeout(timeout)
        request = httpx.Request(
            "POST",
            url,
            content=content,
            headers=merged,
            extensions={"timeout": timeout.as_dict()},
        )
        response = self._pick(request.url).handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        response.request = request
        return response

    def close(self) -> None:
        self._client.close()


@functools.lru_cache(maxsize=1)
def shared_ssl_context() -> Any:
    """One TLS context for every client of the process.

    httpx builds a context per transport, and loading the CA bundle into it takes
    ~26 ms here: every run (and every child run of an agent node) paid it again.
    Made the same way httpx makes it (the environment's SSL_CERT_FILE/DIR apply).
    """
    import httpx

    return httpx.create_ssl_context()


# --- aborting in-flight requests ------------------------------------------------

_NOTHING_TO_ABORT = contextlib.nullcontext()


class _AbortScope:
    """One thread's abortable region: the stream it is using, and whether to stop.

    A context manager: inside it, ``token`` firing aborts the thread's request."""

    __slots__ = ("_lock", "_registry", "_remove", "_stream", "_token", "aborted")

    def __init__(self, token: CancelToken, registry: _AbortRegistry) -> None:
        self._lock = threading.Lock()
        self.aborted = False
        self._stream: Any = None
        self._token = token
        self._registry = registry
        self._remove: Any = None

    def __enter__(self) -> None:
        self._remove = self._token.on_cancel(self.abort)
        self._registry.enter(self)

    def __exit__(self, *exc_info: object) -> None:
        self._registry.leave()
        # Dropped, not kept: it holds the callback, a method of this scope (a cycle).
        remove, self._remove = self._remove, None
        remove()

    def begin_io(self, stream: Any) -> None:
        with self._lock:
            if self.aborted:
                import httpcore

                raise httpcore.ReadError("request cancelled")
            self._stream = stream

    def end_io(self) -> None:
        with self._lock:
            self._stream = None

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            stream = self._stream
        if stream is not None:
            sock = stream.get_extra_info("socket")
            if sock is not None:
                # shutdown (not close) wakes a recv blocked in another thread.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _AbortRegistry:
    """The current thread's :class:`_AbortScope`, if any."""

    def __init__(self) -> None:
        self._local = threading.local()

    def enter(self, scope: _AbortScope) -> None:
        self._local.scope = scope

    def leave(self) -> None:
        self._local.scope = None

    def current(self) -> _AbortScope | None:
        return getattr(self._local, "scope", None)


class _AbortableStream:
    """An httpcore network stream that tells the thread's scope which socket is busy."""

    def __init__(self, inner: Any, registry: _AbortRegistry) -> None:
        self._inner = inner
        self._registry = registry

    def _io(self, method: str, *args: Any, **kwargs: Any) -> Any:
        scope = self._registry.current()
        if scope is None:
            return getattr(self._inner, method)(*args, **kwargs)
        scope.begin_io(self)
        try:
            return getattr(self._inner, method)(*args, **kwargs)
        finally:
            scope.end_io()

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._io("read", max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._io("write", buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> _AbortableStream:
        return _AbortableStream(self._io("start_tls", *args, **kwargs), self._registry)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _AbortableBackend:
    """Wraps httpcore's network backend so every stream is an :class:`_AbortableStream`."""

    def __init__(self, inner: Any, registry: _AbortRegistry) -> None:
        self._inner = inner
        self._registry = registry

    def _check(self) -> None:
        scope = self._registry.current()
        if scope is not None and scope.aborted:
            import httpcore

            raise httpcore.ConnectError("request cancelled")

    def connect_tcp(self, *args: Any, **kwargs: Any) -> _AbortableStream:
        self._check()
        return _AbortableStream(self._inner.connect_tcp(*args, **kwargs), self._registry)

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _AbortableStream:
        self._check()
        return _AbortableStream(self._inner.connect_unix_socket(*args, **kwargs), self._registry)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


# --- replay -----------------------------------------------------------------------


class ReplayTransport:
    """Recorded ``LlmCalled`` events, indexed by the request each answered.

    A request matches a recording with the same method, protocol endpoint
    (``/chat/completions`` or ``/v1/messages``, whatever the base URL) and
    canonical JSON body; when the same request was recorded several times (retries, a loop
    visiting a node again) the recordings are served in their recorded order.
    A recorded transport failure (no status) is raised again as one.
    """

    def __init__(self, events: Iterable[LlmCalled]) -> None:
        self._events = list(events)
        self._queues: dict[tuple[str, str, bytes], deque[LlmCalled]] = {}
        for event in self._events:
            key = ("POST", _endpoint(_path(event.url)), _canonical_bytes(event.request))
            self._queues.setdefault(key, deque()).append(event)
        self._lock = threading.Lock()

    def resolve(self, model_id: str) -> ResolvedModel | None:
        """A :class:`ResolvedModel` for ``model_id`` built from the recording, if it has one."""
        name, _, model = model_id.partition(":")
        for event in self._events:
            if event.model.partition(":")[0] != name or not event.url:
                continue
            parts = urlsplit(event.url)
            path = parts.path
            if path.endswith("/v1/messages"):
                provider, base_path = "anthropic", path[: -len("/v1/messages")]
            elif path.endswith("/chat/completions"):
                provider, base_path = "openai", path[: -len("/chat/completions")]
            else:
                continue
            return ResolvedModel(
                provider=provider,
                model=str(event.request.get("model") or model),
                base_url=f"{parts.scheme}://{parts.netloc}{base_path}",
                api_key=None,
                client_name=name,
            )
        return None

    def take_event(self, method: str, path: str, content: bytes) -> LlmCalled:
        """The recorded call answering this request.

        Raises :class:`LlmReplayMissError` when nothing recorded matches, and the
        recorded transport error (as httpx raises it) when the call had failed.
        """
        endpoint = _endpoint(path)
        body: Any = None
        # The providers send canonical JSON (sorted keys), so the bytes are the key;
        # anything else is parsed and canonicalised first.
        key = (method, endpoint, bytes(content))
        if key not in self._queues:
            try:
                body = msgspec.json.decode(content or b"null")
            except msgspec.DecodeError:
                body = None
            key = (method, endpoint, _canonical_bytes(body))
        with self._lock:
            queue = self._queues.get(key)
            event = queue.popleft() if queue else None
        if event is None:
            if body is None:
                with contextlib.suppress(msgspec.DecodeError):
                    body = msgspec.json.decode(content or b"null")
            raise LlmReplayMissError(self._miss_message(method, path, body, key))
        if event.status is None:
            import httpx

            message = event.error or "recorded transport failure"
            request = httpx.Request(method, path)
            if "timed out" in message:
                raise httpx.ReadTimeout(message, request=request)
            raise httpx.ConnectError(message, request=request)
        return event

    def _miss_message(self, method: str, path: str, body: Any, key: tuple[str, str, bytes]) -> str:
        model = body.get("model") if isinstance(body, dict) else None
        text = f"no recorded LLM response matches {method} {path} (model {model!r})"
        endpoint = _endpoint(path)
        same_path = [e for e in self._events if _endpoint(urlsplit(e.url).path) == endpoint]
        if key in self._queues:
            return (
                f"{text}: the recording has this request only {len(self._events_for(key))} time(s)"
            )
        if not same_path:
            return f"{text}: the recording has no calls to {path}"
        differing = min(
            (_differing_keys(event.request, body) for event in same_path),
            key=len,
        )
        return (
            f"{text}: the closest recorded request differs in {', '.join(differing)}"
            " (the prompt, model or settings changed since the run was recorded)"
        )

    def _events_for(self, key: tuple[str, str, bytes]) -> list[LlmCalled]:
        return [
            event
            for event in self._events
            if ("POST", _endpoint(_path(event.url)), _canonical_bytes(event.request)) == key
        ]

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> ReplayTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _response_bytes(event: LlmCalled) -> bytes:
    """The response body a recorded call got, as bytes."""
    response = event.response if event.response is not None else {}
    if set(response) == {"_raw"}:
        return str(response["_raw"]).encode("utf-8")
    return msgspec.json.encode(response)


class _ReplayResponse:
    """The part of ``httpx.Response`` the providers read, plus ``parsed``: the
    recorded JSON object itself, so that it is not encoded only to be decoded."""

    __slots__ = ("_event", "headers", "parsed", "status_code")

    reason_phrase = ""

    def __init__(self, event: LlmCalled) -> None:
        self._event = event
        self.status_code = event.status or 200
        self.headers = {"content-type": "application/json"}
        response = event.response
        self.parsed = response if response is not None and set(response) != {"_raw"} else None

    @property
    def content(self) -> bytes:
        return _response_bytes(self._event)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")


class ReplayClient:
    """Answers ``post`` from a :class:`ReplayTransport` without httpx's request objects."""

    replaying = True

    def __init__(self, transport: ReplayTransport) -> None:
        self.transport = transport

    def post(self, url: str, *, content: bytes, headers: Any = None, timeout: Any = None) -> Any:
        return _ReplayResponse(self.transport.take_event("POST", _path(url), content))

    def close(self) -> None:
        """Nothing to release."""


# The protocols' endpoints: a recording answers the same endpoint whatever the base
# URL was (another host, a proxy prefix), so a run recorded against one server
# replays on a machine configured for another, or for none.
_ENDPOINTS = ("/chat/completions", "/v1/messages")


@functools.lru_cache(maxsize=256)
def _endpoint(path: str) -> str:
    return next((end for end in _ENDPOINTS if path.endswith(end)), path)


@functools.lru_cache(maxsize=256)
def _path(url: str) -> str:
    return urlsplit(url).path


def _differing_keys(recorded: dict[str, Any], body: Any) -> list[str]:
    if not isinstance(body, dict):
        return ["the whole body"]
    keys = sorted(set(recorded) | set(body))
    return [
        key for key in keys if canonical_json(recorded.get(key)) != canonical_json(body.get(key))
    ]


__all__ = [
    "CONNECT_TIMEOUT",
    "READ_TIMEOUT",
    "ClientFactory",
    "LlmReplayMissError",
    "ReplayTransport",
    "canonical_json",
]
