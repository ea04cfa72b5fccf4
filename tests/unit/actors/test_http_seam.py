"""The HTTP seam: replay through ``httpx.MockTransport``, live calls on an event loop
that another thread can abort, and a factory that leaves no thread behind."""

from __future__ import annotations

import gc
import re
import threading
import time

import httpx
import pytest

from graphrun.actors.base import CancelToken
from graphrun.actors.llm.client import ClientFactory, ReplayTransport
from graphrun.actors.llm.config import load_llm_config
from graphrun.actors.llm.providers import get_provider
from graphrun.actors.llm.providers.base import ChatRequest, LlmCallError
from graphrun.eventstore.events import LlmCalled
from tests.support.fake_llm import FakeLlm, raw, text

REQUEST = ChatRequest(model="openai:gpt-test", messages=[{"role": "user", "content": "q"}])


def _recorded(response: dict | None, status: int | None = 200, error: str | None = None):
    return LlmCalled(
        node_id="n",
        visit=1,
        model="openai:gpt-test",
        url="http://127.0.0.1:9/v1/chat/completions",
        request={"messages": [{"content": "q", "role": "user"}], "model": "gpt-test"},
        status=status,
        response=response,
        error=error,
    )


def _call(factory: ClientFactory, request: ChatRequest = REQUEST):
    resolved = factory.resolve(request.model)
    client = factory.client(resolved.base_url)
    return get_provider(resolved.provider).call(client, resolved, request)


def _http_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "graphrun-http"]


def test_a_replayed_response_is_served_by_an_httpx_mock_transport() -> None:
    event = _recorded({"choices": [{"message": {"role": "assistant", "content": "a"}}]})
    config = load_llm_config(None, env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    with ClientFactory.replay([event], config) as factory:
        client = factory.client("http://127.0.0.1:9/v1")
        assert isinstance(client.transport, httpx.MockTransport)
        response = client.post(
            "http://127.0.0.1:9/v1/chat/completions",
            content=b'{"messages":[{"content":"q","role":"user"}],"model":"gpt-test"}',
        )
        assert isinstance(response, httpx.Response)
        assert (response.status_code, response.json()) == (200, event.response)
        assert response.request.url.path == "/v1/chat/completions"
    assert _http_threads() == []  # replay starts no thread


def test_a_recorded_body_that_was_not_json_is_decoded_as_live() -> None:
    """The recorded text goes through the provider's own decode path, as live."""
    with FakeLlm() as fake:
        fake.script(raw("<html>oops</html>", content_type="text/html"))
        config = load_llm_config(None, env={"OPENAI_BASE_URL": fake.url_openai})
        with ClientFactory(config) as live, pytest.raises(LlmCallError) as live_error:
            _call(live)
        base_url = fake.url_openai
    event = _recorded(live_error.value.body, status=live_error.value.status)
    with (
        ClientFactory.replay([event], load_llm_config(None, env={})) as replay,
        pytest.raises(LlmCallError) as replayed_error,
    ):
        _call(replay)
    live_message = live_error.value.message.replace(base_url, "")
    replayed_message = replayed_error.value.message.replace("https://api.openai.com/v1", "")
    assert replayed_message == live_message
    assert replayed_error.value.body == live_error.value.body


def test_a_recorded_transport_failure_is_raised_as_httpx_raises_it() -> None:
    transport = ReplayTransport([_recorded(None, status=None, error="connection reset by peer")])
    request = httpx.Request(
        "POST",
        "http://elsewhere/v1/chat/completions",
        content=b'{"messages":[{"content":"q","role":"user"}],"model":"gpt-test"}',
    )
    with pytest.raises(httpx.ConnectError) as caught:
        httpx.MockTransport(transport.handle).handle_request(request)
    assert caught.value.request is request
    assert str(caught.value) == "connection reset by peer"


def test_a_live_call_is_aborted_from_another_thread_and_the_factory_closes_its_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with FakeLlm() as fake:
        fake.script(text("late", delay=10))
        config = load_llm_config(None, env={"OPENAI_BASE_URL": fake.url_openai})
        factory = ClientFactory(config)
        token = CancelToken()
        timer = threading.Timer(0.3, token.cancel)
        timer.start()
        started = time.monotonic()
        try:
            with factory.abort_on(token), pytest.raises(LlmCallError) as caught:
                _call(factory)
        finally:
            timer.cancel()
        assert time.monotonic() - started < 3
        assert "request cancelled" in caught.value.message
        assert len(_http_threads()) == 1
        factory.close()
        assert _http_threads() == []
    # The aborted request's task ended with its cancellation, not with an error
    # nobody retrieves (asyncio logs that when the task is collected).
    del caught
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_closing_the_factory_ends_a_call_still_in_flight() -> None:
    with FakeLlm() as fake:
        fake.script(text("late", delay=10))
        config = load_llm_config(None, env={"OPENAI_BASE_URL": fake.url_openai})
        factory = ClientFactory(config)
        errors: list[BaseException] = []

        def in_flight() -> None:
            try:
                _call(factory)
            except BaseException as exc:
                errors.append(exc)

        caller = threading.Thread(target=in_flight)
        caller.start()
        time.sleep(0.3)
        factory.close()
        caller.join(5)
        assert not caller.is_alive()
        assert isinstance(errors[0], LlmCallError)
        assert "request cancelled" in errors[0].message


def test_a_refused_connection_says_so_and_is_transient() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = load_llm_config(None, env={"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1"})
    with ClientFactory(config) as factory, pytest.raises(LlmCallError) as caught:
        _call(factory)
    assert "Connection refused" in caught.value.message
    assert caught.value.transient


def test_a_host_that_does_not_resolve_is_named_by_the_resolver() -> None:
    # The resolver's codes are negative; the system's strerror does not know them.
    config = load_llm_config(None, env={"OPENAI_BASE_URL": "http://no-such-host.invalid/v1"})
    with ClientFactory(config) as factory, pytest.raises(LlmCallError) as caught:
        _call(factory)
    assert "Unknown error" not in caught.value.message
    assert re.search(r"\[Errno -\d+\] \w", caught.value.message), caught.value.message
