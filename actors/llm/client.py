"""The one seam LLM calls go through: httpx clients per base URL, live or replaying.

:class:`ClientFactory` hands out one client per base URL (connections are
reused across nodes and turns) and resolves model ids. Replaying, the client is
an ``httpx.Client`` over an ``httpx.MockTransport`` that answers from a
:class:`ReplayTransport` of recorded ``LlmCalled`` events: the providers send,
receive and decode exactly as they do live; only the transport differs.

Live calls go through an ``aiohttp.ClientSession`` on the factory's own event-loop
thread, so that they can be aborted from another thread: :meth:`ClientFactory.abort_on`
ties the calling thread's in-flight request to a :class:`CancelToken`; when the
token fires, the request's task is cancelled, which closes its connection at
once instead of waiting for the model to finish (and the server stops
generating tokens nobody will read). aiohttp, not httpx, on the wire: its HTTP
parser and connection pool are compiled, and a map of 100 concurrent calls spent
most of its time in httpx's pool; the providers still read the response as
httpx's ``Response`` (a compressed body decoded by httpx, as a live httpx call
is) and get httpx's exceptions.
Environment proxies apply (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``), and
nothing outside either library's public API is used.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, unquote, urlsplit

import msgspec

from graphrun.actors.base import CancelToken
from graphrun.actors.llm.config import LlmConfig, LlmConfigError, ResolvedModel, load_llm_config
from graphrun.actors.llm.providers.base import RetryPolicy
from graphrun.actors.loop import EffectLoop, TaskOutcome
from graphrun.eventstore.errors import GraphrunError
from graphrun.eventstore.events import LlmCalled

if TYPE_CHECKING:
    import aiohttp
    import httpx

log = logging.getLogger(__name__)

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
        loop: EffectLoop | None = None,
    ) -> None:
        self.config = config if config is not None else load_llm_config(None)
        self.retry = retry if retry is not None else RetryPolicy()
        self._recording = recording
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._aborts = _AbortRegistry()
        self._resolved: dict[str, ResolvedModel] = {}
        # The loop live calls are awaited on: the run's (shared with its other
        # effects, and kept with its pooled session by whoever made it), or the
        # factory's own, made on first use and stopped by close().
        self._loop: EffectLoop | None = loop
        self._owns_loop = loop is None

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

    def client(self, base_url: str) -> Any:
        """The shared client for ``base_url`` (created on first use): an object with
        httpx's ``post(url, content=, headers=, timeout=)`` and ``close()``, whose
        ``timeout`` is a :class:`~graphrun.actors.llm.providers.base.Post`'s.

        Replaying, a :class:`_TransportClient` over an ``httpx.MockTransport``
        serving the recording (nothing leaves the process). Live, a
        :class:`_LiveClient`: the call on an ``aiohttp.ClientSession`` on the
        factory's event-loop thread. Either way the providers read httpx's
        ``Response`` (live, the part of it they read: :func:`_httpx_response`).
        """
        existing = self._clients.get(base_url)  # made once: every later call reads it
        if existing is not None:
            return existing
        with self._lock:
            existing = self._clients.get(base_url)
            if existing is not None:
                return existing
            if self._recording is not None:
                import httpx

                created: Any = _TransportClient(httpx.MockTransport(self._recording.handle))
            else:
                created = _LiveClient(self._event_loop(), self._aborts, self._session_maker())
            self._clients[base_url] = created
            return created

    def run_on_loop(self, coro: Coroutine[Any, Any, Any]) -> TaskOutcome:
        """Run ``coro`` as a task on the factory's event-loop thread (started on first
        use), where its live clients' :meth:`_LiveClient.post_async` may be awaited;
        the returned :class:`TaskOutcome` completes with it."""
        with self._lock:
            loop = self._event_loop()
        return loop.start(coro)

    def _event_loop(self) -> EffectLoop:
        """The loop live calls run on (the factory's own is made here; under the lock)."""
        if self._loop is None:
            self._loop = EffectLoop("graphrun-http")
        return self._loop

    def _session_maker(self) -> Callable[[], Any]:
        """What makes the live clients' session (on the loop's thread, at the first
        call): on the run's loop, the one session kept with that loop for every
        factory using it (its connections outlive a run); on the factory's own
        loop, a session of its own."""
        if self._owns_loop:
            return self._async_client
        loop = self._loop
        assert loop is not None
        key = ("aiohttp", self._connect_timeout, self._read_timeout)
        return lambda: loop.keep(key, self._async_client)

    def _async_client(self) -> aiohttp.ClientSession:
        """A pooled session (made on the loop thread, where it is used).

        The environment's proxies apply (see :func:`_env_proxy`). No connection cap: a
        super-step's concurrent calls (a map at max_concurrency 100) never queue for
        a connection behind a fixed pool. Compressed bodies are left for httpx to
        decode, as a live httpx call would. Retries: none here; ours are counted,
        recorded, and only for transient errors.
        """
        return _new_session(self._connect_timeout, self._read_timeout)

    def abort_on(self, token: CancelToken) -> contextlib.AbstractContextManager[None]:
        """While in this block, ``token`` firing aborts this thread's in-flight request."""
        if self._recording is not None:
            return _NOTHING_TO_ABORT  # a replayed call never waits on anything
        return _AbortScope(token, self._aborts)

    def close(self) -> None:
        """Close every pooled client (and the event-loop thread, if one was started)."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            loop = self._loop if self._owns_loop else None
            if self._owns_loop:
                self._loop = None
        if loop is not None:
            loop.cancel_all()  # calls still in flight end now, as aborted
            for client in clients:
                client.close()
            loop.stop()

    def __enter__(self) -> ClientFactory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@functools.lru_cache(maxsize=1)
def shared_ssl_context() -> Any:
    """One TLS context for every client of the process.

    httpx builds a context per transport, and loading the CA bundle into it takes
    ~26 ms here: every run (and every child run of an agent node) paid it again.
    Made as httpx makes its own: certifi's CA bundle, unless the environment names
    another (``SSL_CERT_FILE``, else ``SSL_CERT_DIR``). Made here rather than by
    httpx: a live run does not import httpx (it brings ~40 ms of modules, rich and
    pygments among them, for its command line).
    """
    import ssl

    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


# --- live calls on an event loop, abortable from any thread ------------------------

_NOTHING_TO_ABORT = contextlib.nullcontext()


def _new_session(connect: float, read: float) -> aiohttp.ClientSession:
    """A pooled aiohttp session, made on the loop thread where it is used (see
    :meth:`ClientFactory._async_client`)."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=shared_ssl_context()),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read),
        auto_decompress=False,
    )


def loop_client(loop: EffectLoop) -> Any:
    """The live client kept with ``loop`` for HTTP that is not an llm node's (a rag
    node's embedding and rerank requests), awaited on that loop with
    ``post_async``. It sends on the session an llm call with the default timeouts
    uses on that loop, so both share one connection pool; the loop closes it when
    it stops. Each request says its own timeout: ``(connect, read)`` seconds."""
    key = ("aiohttp", CONNECT_TIMEOUT, READ_TIMEOUT)

    def session() -> Any:
        return loop.keep(key, lambda: _new_session(CONNECT_TIMEOUT, READ_TIMEOUT))

    return loop.keep(("live client",), lambda: _LiveClient(loop, _AbortRegistry(), session))


class _LiveClient:
    """``post`` and ``close`` of an ``aiohttp.ClientSession`` run on an :class:`EffectLoop`,
    for the providers' synchronous code: the response reads as httpx's, read in full,
    and a failure is raised as the httpx exception a live httpx call raises.

    A request made inside :meth:`ClientFactory.abort_on` is cancelled when the
    token fires: its task is cancelled on the loop, and the call raises
    ``httpx.ReadError`` at once.
    """

    def __init__(self, loop: EffectLoop, aborts: _AbortRegistry, make: Any) -> None:
        self._loop = loop
        self._aborts = aborts
        self._session: aiohttp.ClientSession | None = None
        self._make = make
        # Scheme and host -> the proxy options for it, read from the environment once.
        self._proxies: dict[tuple[str, str], dict[str, Any]] = {}
        # URL -> where a POST to it goes (:meth:`_target`).
        self._targets: dict[str, tuple[str, str | None, dict[str, Any]]] = {}

    def _target(self, url: str) -> tuple[str, str | None, dict[str, Any]]:
        """Where a POST to ``url`` goes, worked out once per URL: the URL without any
        user info, that user info as a Basic ``Authorization`` value (or None), and
        the environment's proxy options for its scheme and host."""
        split = urlsplit(url)
        auth = None
        if split.username is not None or split.password is not None:
            url, auth = _without_userinfo(split)
        where = (split.scheme, split.hostname or "")
        proxy = self._proxies.get(where)
        if proxy is None:
            proxy = self._proxies[where] = _env_proxy(*where)
        return url, auth, {**proxy}

    def post(self, url: str, *, content: bytes, headers: Any = None, timeout: Any = None) -> Any:
        """The request, from any thread but the loop's: its response, or the httpx
        exception a live httpx call raises."""
        scope = self._aborts.current()
        future = self._loop.submit(self._send(url, content, headers, timeout))
        if scope is not None:
            scope.watch(future)
        try:
            return future.result()
        except BaseException as exc:
            future.cancel()  # e.g. KeyboardInterrupt in the waiting thread
            mapped = _as_httpx(exc, url)  # an abort cancelled it: httpx.ReadError
            if mapped is None:
                raise
            raise mapped from exc
        finally:
            if scope is not None:
                scope.unwatch()

    async def post_async(
        self,
        url: str,
        *,
        content: bytes,
        headers: Any = None,
        timeout: Any = None,
        cancelled_as_read_error: bool = True,
    ) -> Any:
        """:meth:`post` for a coroutine on the client's own loop (never another):
        the same response and the same httpx exceptions. Cancelling the awaiting
        task aborts the request (``httpx.ReadError``), as a token does for
        :meth:`post`; or, with ``cancelled_as_read_error`` false, the task ends
        cancelled, as any awaited request's does. (The request itself, not a
        coroutine around :meth:`_send`: a map's calls each keep one coroutine fewer
        alive while they wait.)"""
        try:
            async with self._request(url, content, headers, timeout) as response:
                body = await response.read()
                return _httpx_response(response.status, list(response.raw_headers), body)
        except BaseException as exc:
            if not cancelled_as_read_error and isinstance(exc, asyncio.CancelledError):
                raise
            mapped = _as_httpx(exc, url)
            if mapped is None:
                raise
            raise mapped from exc

    async def _send(self, url: str, content: bytes, headers: Any, timeout: Any) -> Any:
        """The request on the loop's thread: the response, read in full; aiohttp's
        exceptions (and a cancellation) as they are, for the caller to map."""
        async with self._request(url, content, headers, timeout) as response:
            body = await response.read()
            return _httpx_response(response.status, list(response.raw_headers), body)

    def _request(self, url: str, content: bytes, headers: Any, timeout: Any) -> Any:
        """aiohttp's POST of ``content`` to ``url``, to enter with ``async with`` (a
        plain call: no coroutine of its own around the request)."""
        where, headers, options = self._prepared(url, headers, timeout)
        return self._session_now().post(
            where, data=content, headers=headers, allow_redirects=False, **options
        )

    def _session_now(self) -> Any:
        """The session (made on first use; on the loop's thread only, so no lock)."""
        session = self._session
        if session is None:
            session = self._session = self._make()
        return session

    def _prepared(self, url: str, headers: Any, timeout: Any) -> tuple[str, Any, dict[str, Any]]:
        """Where a POST to ``url`` goes, its headers and aiohttp's options for it."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = self._target(url)
        where, auth, options = target
        if auth is not None:
            # Credentials in the URL: sent as Basic auth, in place of any Authorization
            # header, as httpx sends them.
            headers = {k: v for k, v in dict(headers or {}).items() if k.lower() != "authorization"}
            headers["Authorization"] = auth
        timeout = _aiohttp_timeout(timeout)
        if timeout is not None:
            options = {**options, "timeout": timeout}
        return where, headers, options

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                self._loop.submit(session.close()).result(timeout=10)


def _httpx_response(status: int, raw_headers: list[tuple[bytes, bytes]], body: bytes) -> Any:
    """What aiohttp received, read in full, as the providers read a response: an
    uncompressed body as a :class:`_Received`; a compressed one as httpx's own
    ``Response``, which decodes it as httpx does live."""
    for name, value in raw_headers:
        if name.lower() == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            break
    else:
        return _Received(status, raw_headers, body)
    import httpx

    # No ``request``: building one costs more than the rest (URL and headers parsed
    # again), and nothing reads it.
    response = httpx.Response(status, headers=raw_headers, stream=httpx.ByteStream(body))
    response.read()
    return response


class _Received:
    """A live response read in full: the part of httpx's ``Response`` that
    :meth:`Provider.exchange` reads (``status_code``, ``content``, ``headers``,
    ``reason_phrase``), without building one per call (its headers and stream cost
    more than the rest of the call's parsing). ``headers`` is httpx's, made when
    asked for (a 429's ``Retry-After``)."""

    __slots__ = ("_raw", "content", "status_code")

    def __init__(self, status: int, raw_headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status_code = status
        self.content = body
        self._raw = raw_headers

    @property
    def headers(self) -> httpx.Headers:
        import httpx

        return httpx.Headers(self._raw)

    @property
    def reason_phrase(self) -> str:
        import httpx

        return httpx.codes.get_reason_phrase(self.status_code)

    @property
    def text(self) -> str:
        """The body as text (UTF-8; what is not is replaced)."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON (raises ``ValueError`` when it is not)."""
        return json.loads(self.content)


def _basic(username: str, password: str) -> str:
    import base64

    credentials = f"{unquote(username)}:{unquote(password)}".encode()
    return "Basic " + base64.b64encode(credentials).decode()


def _without_userinfo(split: SplitResult) -> tuple[str, str]:
    """The URL without its user info, and that user info as a Basic auth value."""
    netloc = split.hostname or ""
    if split.port is not None:
        netloc = f"{netloc}:{split.port}"
    auth = _basic(split.username or "", split.password or "")
    return split._replace(netloc=netloc).geturl(), auth


def _env_proxy(scheme: str, host: str) -> dict[str, Any]:
    """aiohttp's proxy options for a request to ``host`` over ``scheme``, from the
    environment as httpx reads it: ``HTTP_PROXY``/``HTTPS_PROXY`` by scheme, else
    ``ALL_PROXY``, none for a host ``NO_PROXY`` names; credentials in the proxy's URL
    are sent to the proxy. (aiohttp's own ``trust_env`` looks them up again, on a
    worker thread, on every request.)"""
    import urllib.request

    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    # proxy_bypass_environment is in urllib.request, though not in its type stubs.
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxy or (host and bypass(host, proxies)):
        return {}
    if "://" not in proxy:
        proxy = f"http://{proxy}"
    parts = urlsplit(proxy)
    if parts.username is None:
        return {"proxy": proxy}
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc = f"{netloc}:{parts.port}"
    return {
        "proxy": parts._replace(netloc=netloc).geturl(),
        "proxy_headers": {"Proxy-Authorization": _basic(parts.username, parts.password or "")},
    }


def _aiohttp_timeout(timeout: tuple[float, float] | None) -> Any:
    """aiohttp's timeout for a :class:`~graphrun.actors.llm.providers.base.Post`'s
    ``(connect, read)`` seconds (``None``: the session's)."""
    return None if timeout is None else _client_timeout(*timeout)


@functools.lru_cache(maxsize=64)
def _client_timeout(connect: float | None, read: float | None) -> Any:
    """One (immutable) ``aiohttp.ClientTimeout`` per pair of values, not one per call."""
    import aiohttp

    return aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read)


def _as_httpx(exc: BaseException, url: str) -> Exception | None:
    """What a live POST to ``url`` raises for ``exc``: ``httpx.ReadError`` when the
    request was cancelled (aborted), else :func:`_httpx_error`'s mapping; None when
    ``exc`` goes on as it is (an interrupt, a bug)."""
    import httpx

    request = httpx.Request("POST", url)
    if isinstance(exc, concurrent.futures.CancelledError | asyncio.CancelledError):
        return httpx.ReadError("request cancelled", request=request)
    return _httpx_error(exc, request)


def _httpx_error(exc: BaseException, request: httpx.Request) -> Exception | None:
    """The httpx exception a live httpx call raises where aiohttp raised ``exc``."""
    import aiohttp
    import httpx

    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return httpx.ProxyError(str(exc), request=request)
    if isinstance(exc, aiohttp.ClientSSLError):
        # What TLS said, as httpx says it ("[SSL: CERTIFICATE_VERIFY_FAILED]
        # certificate verify failed: ..."): an SSL error's errno is OpenSSL's
        # reason, not the system's, so it is never read as one ("[Errno 1]").
        cause = getattr(exc, "certificate_error", None) or exc.os_error
        return httpx.ConnectError(str(cause), request=request)
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return httpx.ConnectTimeout(str(exc) or "connect timed out", request=request)
        # Say what the system said, as a blocking connect does.
        return httpx.ConnectError(system_error(exc) or str(exc), request=request)
    if isinstance(exc, TimeoutError):  # aiohttp's read timeouts are TimeoutErrors too
        return httpx.ReadTimeout(str(exc) or "read timed out", request=request)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(f"invalid URL: {exc}", request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request)
    if isinstance(exc, aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(str(exc), request=request)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return httpx.ReadError(str(exc) or type(exc).__name__, request=request)
    return None


def system_error(exc: BaseException) -> str | None:
    """What the system said where ``exc`` comes from, as a blocking connect names
    it: ``[Errno 111] Connection refused``, ``[Errno -2] Name or service not known``
    (a resolver's codes are negative, and only its own error knows their text).
    None when no system error is among its causes, or the first is TLS's (an SSL
    error's errno is OpenSSL's reason, not the system's)."""
    import ssl

    found = _os_error(exc)
    if found is None or found.errno is None or isinstance(found, ssl.SSLError):
        return None
    code = found.errno
    text = os.strerror(code) if code > 0 else found.strerror or str(found)
    return f"[Errno {code}] {text}"


def _os_error(exc: BaseException) -> OSError | None:
    """The first system error with an errno among ``exc``'s causes, if any."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno:
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


class _TransportClient:
    """``post`` and ``close`` straight through an httpx transport (replay: the
    recording's ``httpx.MockTransport``), with httpx's own ``Request`` and ``Response``.

    ``httpx.Client.send`` would add a cookie jar, auth and redirect handling, none
    of which a recorded response can use, at twice the cost of the rest of a
    replayed call; a live call goes through the full client (:class:`_LiveClient`).
    """

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self.transport = transport
        # Parsed once per URL: parsing is most of the cost of building a request.
        self._urls: dict[str, httpx.URL] = {}

    def post(
        self, url: str, *, content: bytes, headers: Any = None, timeout: Any = None
    ) -> httpx.Response:
        import httpx

        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)
        # The body as a ready stream: no Host or Content-Length to work out for a
        # request that goes to no host.
        request = httpx.Request("POST", parsed, headers=headers, stream=httpx.ByteStream(content))
        request.read()
        response = self.transport.handle_request(request)
        response.read()
        return response

    async def post_async(
        self, url: str, *, content: bytes, headers: Any = None, timeout: Any = None
    ) -> httpx.Response:
        """:meth:`post` for a visit awaited on the run's loop: the recording answers
        in memory, without a wait, so it is answered in place."""
        return self.post(url, content=content, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.transport.close()


class _AbortScope:
    """One thread's abortable region: the request it is waiting on, and whether to stop.

    A context manager: inside it, ``token`` firing cancels the thread's request."""

    __slots__ = ("_future", "_lock", "_registry", "_remove", "_token", "aborted")

    def __init__(self, token: CancelToken, registry: _AbortRegistry) -> None:
        self._lock = threading.Lock()
        self.aborted = False
        self._future: concurrent.futures.Future[Any] | None = None
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

    def watch(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._future = future
            aborted = self.aborted
        if aborted:
            future.cancel()

    def unwatch(self) -> None:
        with self._lock:
            self._future = None

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            future = self._future
        if future is not None:
            future.cancel()  # cancels the task on the loop, which closes the connection


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

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer ``request`` with its recorded response (the ``httpx.MockTransport``
        handler): the recorded status and body; a recorded transport failure is
        raised again as httpx raises it."""
        import httpx

        try:
            event = self.take_event(request.method, request.url.path, request.content)
        except httpx.TransportError as exc:
            exc.request = request
            raise
        body = _response_bytes(event)
        # As a transport returns a response: headers and an unread byte stream.
        return httpx.Response(
            event.status or 200,
            headers=[*_JSON_HEADERS, (b"content-length", str(len(body)).encode())],
            stream=httpx.ByteStream(body),
            request=request,
        )

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> ReplayTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_JSON_HEADERS = [(b"content-type", b"application/json")]


def _response_bytes(event: LlmCalled) -> bytes:
    """The response body a recorded call got, as bytes."""
    response = event.response if event.response is not None else {}
    if set(response) == {"_raw"}:
        return str(response["_raw"]).encode("utf-8")
    return msgspec.json.encode(response)


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
    "TaskOutcome",
    "canonical_json",
    "loop_client",
    "system_error",
]
