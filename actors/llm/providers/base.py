"""What every LLM provider shares: the neutral request/response, errors, retry rules.

A provider (``openai.py``, ``anthropic.py``) only knows its wire protocol: how a
:class:`ChatRequest` becomes a JSON body, and how a response body (or an error
body) becomes a :class:`ChatResponse` (or an :class:`LlmCallError`). Sending the
request, timing it and turning transport failures into clear messages happens
once, here, in :meth:`Provider.exchange` (:meth:`Provider.call` sends it blocking).

Neutral messages are dicts with ``role`` ``"user"``, ``"assistant"`` or ``"tool"``:

* user: ``{"role": "user", "content": str}``
* assistant: ``{"role": "assistant", "content": str | None,
  "tool_calls": [{"id", "name", "arguments"}]}``
* tool result: ``{"role": "tool", "tool_call_id": str, "content": str,
  "is_error": bool}``
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from graphrun.actors.secrets import redact_url
from graphrun.eventstore import redaction
from graphrun.eventstore.errors import GraphrunError

if TYPE_CHECKING:
    from graphrun.actors.llm.config import ResolvedModel

#: Substrings of an error message that make it worth retrying (the spec's list).
TRANSIENT_MARKERS: tuple[str, ...] = (
    "timed out",
    "rate limit",
    "429",
    "connection reset",
    "connection refused",
    "produced no output",
)
#: HTTP statuses that are retried whatever the message says.
TRANSIENT_STATUSES: frozenset[int] = frozenset({408, 409, 429, 529})
#: HTTP statuses that are never retried whatever the message says.
PERMANENT_STATUSES: frozenset[int] = frozenset({400, 401, 403, 404})

# Error bodies are quoted in messages; a whole HTML error page is not useful.
_EXCERPT_CHARS = 500


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: its JSON-Schema ``parameters`` and where it comes from."""

    name: str
    description: str
    parameters: dict[str, Any]
    source: str


@dataclass(frozen=True)
class ToolResult:
    """What running a tool produced (``is_error`` results are still shown to the model)."""

    output: str
    is_error: bool
    duration_ms: float
    source: str
    # Text the call puts into the system prompt of the following turns (Loki's
    # ``skill__load``: the skill's body), recorded with the call.
    instructions: str | None = None
    # Tools the call offers from the following turn on (``skill__load``: the skill's
    # ``enabled_tools``), recorded with the call.
    tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; ``arguments`` is JSON text."""

    id: str
    name: str
    arguments: str

    def as_dict(self) -> dict[str, str]:
        """The call as recorded in events and neutral messages."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A provider-neutral chat request.

    Sampling parameters and ``max_tokens`` are sent only when set: reasoning
    models reject ``temperature``. ``timeout`` is the whole call's budget in
    seconds (``None``: the client's default).

    A struct, as :class:`ChatResponse` and :class:`Post` are: every call makes one
    of each, and a frozen dataclass takes ~10 times as long to make. Plain data
    that never refers back to itself, so the cyclic collector need not walk it
    (``gc=False``).
    """

    model: str  # provider:model id
    system: str | None = None
    messages: list[dict[str, Any]]
    tools: Sequence[ToolSpec] = ()
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    timeout: float | None = None
    #: ``low`` / ``medium`` / ``high`` (``minimal`` for gpt-5): sent only to models
    #: that take it (see :data:`graphrun.actors.llm.providers.openai.MODEL_RULES`).
    reasoning_effort: str | None = None


class ChatResponse(msgspec.Struct, frozen=True, gc=False):
    """A successful provider response, with everything an ``LlmCalled`` event records."""

    text: str
    tool_calls: list[ToolCall]
    usage: dict[str, Any]
    status: int
    body: dict[str, Any]
    request_body: dict[str, Any]
    url: str
    latency_ms: float


class LlmCallError(GraphrunError):
    """An LLM call failed.

    ``transient`` says whether trying again may help; ``retry_after`` is the
    server's requested wait in seconds, if it sent one. The message carries
    ``HTTP <code>`` whenever there was a response. The remaining attributes are
    what the failed attempt's ``LlmCalled`` event records.
    """

    def __init__(
        self,
        message: str,
        status: int | None = None,
        transient: bool = False,
        retry_after: float | None = None,
        *,
        url: str = "",
        request_body: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        latency_ms: float = 0.0,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.transient = transient
        self.retry_after = retry_after
        self.url = url
        self.request_body = request_body or {}
        self.body = body
        self.latency_ms = latency_ms


def is_transient_message(message: str) -> bool:
    """Whether an error message names one of the spec's transient conditions."""
    lowered = message.lower()
    return any(marker in lowered for marker in TRANSIENT_MARKERS)


def is_transient_status(status: int, message: str, error_type: str = "") -> bool:
    """Whether an HTTP error response is worth retrying.

    Exhausted quota (OpenAI's ``insufficient_quota``, sent with HTTP 429) never is:
    waiting does not refill it.
    """
    if "insufficient_quota" in error_type or "insufficient_quota" in message:
        return False
    if status in PERMANENT_STATUSES:
        return False
    if status in TRANSIENT_STATUSES or status >= 500 or error_type == "overloaded_error":
        return True
    return is_transient_message(message)


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date)."""
    lowered = {key.lower(): value for key, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait between attempts of a transient failure.

    Without a ``retry-after`` from the server the wait doubles from
    ``base_delay`` up to ``max_delay``; a server's ``retry-after`` is honoured up
    to ``retry_after_cap`` (so a misbehaving server cannot stall a run for hours).
    """

    base_delay: float = 1.0
    max_delay: float = 30.0
    retry_after_cap: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        if retry_after is not None:
            return min(retry_after, self.retry_after_cap)
        return min(self.base_delay * (2 ** (attempt - 1)), self.max_delay)


def excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def redact(value: Any, secret: str | None) -> Any:
    """``value`` with every occurrence of ``secret`` replaced (servers echo keys back)."""
    if not secret:
        return value
    if isinstance(value, str):
        return value.replace(secret, "***")
    if isinstance(value, dict):
        return {key: redact(item, secret) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item, secret) for item in value]
    return value


_SORTED = msgspec.json.Encoder(order="sorted")


class Post(msgspec.Struct, frozen=True, gc=False):
    """The HTTP request a provider's :meth:`Provider.exchange` wants sent."""

    url: str
    content: bytes
    headers: dict[str, str]
    #: Seconds to wait: ``None``, the client's own; else ``(connect, read)``.
    timeout: tuple[float, float] | None


def _failure(
    url: str, sent: dict[str, Any], secret: str | None, start: float, message: str, **kwargs: Any
) -> LlmCallError:
    """The :class:`LlmCallError` of a call to ``url`` with body ``sent`` started at
    ``start``, its message and the server's echo of ``secret`` redacted."""
    return LlmCallError(
        redaction.redact(redact(message, secret)),
        url=redact_url(url),
        request_body=sent,
        latency_ms=(time.perf_counter() - start) * 1000.0,
        **kwargs,
    )


def _finish(
    exchange: Generator[Post, Any, ChatResponse],
    *,
    response: Any = None,
    error: BaseException | None = None,
) -> ChatResponse:
    """Hand an exchange its response (or the sending's error); what it returns."""
    try:
        if error is not None:
            exchange.throw(error)
        else:
            assert response is not None
            exchange.send(response)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("an exchange sends one request")


class Provider:
    """A wire protocol. Subclasses build bodies and read responses; this sends them."""

    #: The protocol's name, as in ``ResolvedModel.provider``.
    name: str = ""
    #: The environment variable holding the base URL, named in "could not reach" hints.
    base_url_env: str = ""

    def endpoint(self, base_url: str) -> str:
        """The URL requests are POSTed to."""
        raise NotImplementedError

    def headers(self, api_key: str | None) -> dict[str, str]:
        """Request headers, including authentication when there is a key."""
        raise NotImplementedError

    def build_body(
        self, request: ChatRequest, model: str, max_tokens: int | None
    ) -> dict[str, Any]:
        """The JSON body for ``request``; ``model`` is the provider's own model name."""
        raise NotImplementedError

    def parse_body(self, body: dict[str, Any]) -> tuple[str, list[ToolCall], dict[str, Any]]:
        """``(text, tool_calls, usage)`` of a successful response body."""
        raise NotImplementedError

    def error_details(self, body: dict[str, Any]) -> tuple[str, str]:
        """``(message, error type or code)`` of an error body (empty strings if unknown)."""
        raise NotImplementedError

    def body_error(self, body: dict[str, Any]) -> tuple[str, str] | None:
        """An error reported inside a 200 response, if the protocol has such a thing."""
        return None

    def call(
        self,
        client: Any,
        resolved: ResolvedModel,
        request: ChatRequest,
    ) -> ChatResponse:
        """Send ``request`` with ``client`` (one of :meth:`ClientFactory.client`'s,
        which take a :class:`Post`'s ``timeout``) and return the response, or raise
        :class:`LlmCallError` (the blocking form of :meth:`exchange`)."""
        exchange = self.exchange(resolved, request)
        post = next(exchange)
        try:
            response = client.post(
                post.url, content=post.content, headers=post.headers, timeout=post.timeout
            )
        except Exception as exc:
            return _finish(exchange, error=exc)
        return _finish(exchange, response=response)

    def exchange(
        self, resolved: ResolvedModel, request: ChatRequest
    ) -> Generator[Post, Any, ChatResponse]:
        """One call as a generator: yields the :class:`Post` to send, is sent the
        response (httpx's ``Response``, or what reads as one: ``status_code``,
        ``content``, ``headers``, ``reason_phrase``) or thrown the httpx exception
        the sending raised, and returns the :class:`ChatResponse` or raises
        :class:`LlmCallError`.

        Whoever sends decides how: a blocking client on a worker thread, or a task
        on an event loop (:func:`graphrun.actors.llm.call.perform_llm_async`); what a
        response means is decided here, once, for both."""
        url = self.endpoint(resolved.base_url)
        if request.reasoning_effort is None and resolved.reasoning_effort:
            request = msgspec.structs.replace(request, reasoning_effort=resolved.reasoning_effort)
        body = self.build_body(request, resolved.model, resolved.max_output_tokens)
        if resolved.body_patch:
            from graphrun.actors.llm.models import merge_patch

            body = merge_patch(body, resolved.body_patch)
        # Keys sorted: the bytes sent are the request's canonical JSON, which is
        # also what a recording is matched on (servers do not mind the order).
        content = _SORTED.encode(body)
        headers = self.headers(resolved.api_key)
        headers["content-type"] = "application/json"
        timeout = None
        if request.timeout is not None:
            timeout = (min(request.timeout, 10.0), request.timeout)
        secret = resolved.api_key

        start = time.perf_counter()
        try:
            response = yield Post(url, content, headers, timeout)
        except Exception as exc:
            # What a client raises is httpx's (a live call's aiohttp errors are mapped
            # to them): imported here, as a call fails, not for every call.
            import httpx

            if isinstance(exc, httpx.TimeoutException):
                budget = f" after {request.timeout:g}s" if request.timeout is not None else ""
                message = f"request to {url} timed out{budget} ({exc})"
                raise _failure(url, body, secret, start, message, transient=True) from None
            if isinstance(exc, httpx.ConnectError):
                where = f" (check {self.base_url_env})" if self.base_url_env else ""
                message = f"could not reach {url}: {exc}{where}"
                raise _failure(
                    url, body, secret, start, message, transient=is_transient_message(message)
                ) from None
            if isinstance(exc, httpx.TransportError):
                message = f"connection to {url} failed: {exc or type(exc).__name__}"
                raise _failure(
                    url, body, secret, start, message, transient=is_transient_message(message)
                ) from None
            raise
        latency_ms = (time.perf_counter() - start) * 1000.0
        status = response.status_code
        raw_bytes = response.content
        try:
            data = msgspec.json.decode(raw_bytes) if raw_bytes else {}
        except msgspec.DecodeError:
            data = None
        raw = ""  # the body as text: only for the key check and for messages
        if secret or not isinstance(data, dict) or status >= 400:
            raw = raw_bytes.decode("utf-8", errors="replace")
        parsed: dict[str, Any] = redact(
            data if isinstance(data, dict) else {"_raw": raw[: _EXCERPT_CHARS * 4]},
            # Walk the body only when the server actually echoed the key back.
            secret if secret and secret in raw else None,
        )

        if status >= 400:
            message, kind = self.error_details(parsed) if data is not None else ("", "")
            detail = message or excerpt(raw) or response.reason_phrase
            suffix = f" ({kind})" if kind else ""
            text = f"HTTP {status} from {url}: {detail}{suffix}"
            raise _failure(
                url,
                body,
                secret,
                start,
                text,
                status=status,
                transient=is_transient_status(status, text, kind),
                retry_after=parse_retry_after(response.headers),
                body=parsed,
            )
        if not isinstance(data, dict):
            raise _failure(
                url,
                body,
                secret,
                start,
                f"HTTP {status} from {url}: response is not a JSON object: {excerpt(raw)}",
                status=status,
                body=parsed,
            )
        in_body = self.body_error(data)
        if in_body is not None:
            message, kind = in_body
            text = f"HTTP {status} from {url}: {message} ({kind})"
            raise _failure(
                url,
                body,
                secret,
                start,
                text,
                status=status,
                transient=is_transient_status(status, text, kind),
                body=parsed,
            )
        text_out, tool_calls, usage = self.parse_body(data)
        if redaction.secrets():  # a server echoing any configured key: never pass it on
            text_out = redaction.redact(text_out)
            tool_calls = [ToolCall(c.id, c.name, redaction.redact(c.arguments)) for c in tool_calls]
        if not text_out.strip() and not tool_calls:
            raise _failure(
                url,
                body,
                secret,
                start,
                f"HTTP {status} from {url}: {request.model} produced no output",
                status=status,
                transient=True,
                body=parsed,
            )
        return ChatResponse(
            text=text_out,
            tool_calls=tool_calls,
            usage=usage,
            status=status,
            body=parsed,
            request_body=body,
            url=redact_url(url),
            latency_ms=latency_ms,
        )


__all__ = [
    "PERMANENT_STATUSES",
    "TRANSIENT_MARKERS",
    "TRANSIENT_STATUSES",
    "ChatRequest",
    "ChatResponse",
    "LlmCallError",
    "Post",
    "Provider",
    "RetryPolicy",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "excerpt",
    "is_transient_message",
    "is_transient_status",
    "parse_retry_after",
    "redact",
]
