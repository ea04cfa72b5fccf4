"""Live LLM calls over TLS: the CA bundle they trust, and what a live run imports.

A local OpenAI-protocol server on 127.0.0.1 serves HTTPS with a certificate made
for the test; `graphrun run` (a real subprocess) calls it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_agent
from tests.support.fake_llm import FakeLlm, text

GRAPH = """
name: tls
version: "1.0"
model: openai:gpt-test
start: ask
nodes:
  ask:
    type: llm
    prompt: "hello"
    max_attempts: 3
    state_updates:
      answer: "{{output}}"
    next: done
  done:
    type: end
    output: "{{answer}}"
"""


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "graphrun test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "ca.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture
def tls_llm(tmp_path: Path) -> Iterator[tuple[FakeLlm, Path]]:
    """The fake LLM server over HTTPS, and the CA file that vouches for it."""
    cert_file, key_file = _certificate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    with FakeLlm(tls=context) as server:
        yield server, cert_file


def _run(tmp_path: Path, base_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    agent = write_agent(tmp_path / "agent", GRAPH)
    environ = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    environ.update(
        GRAPHRUN_DB=str(tmp_path / "events.db"),
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY="sk-test-tls",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "graphrun.cli", "run", str(agent), "go"],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        cwd=tmp_path,
    )


def _imported(stderr: str) -> set[str]:
    """The modules ``-X importtime`` says the process imported."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_a_live_call_trusts_the_ca_the_environment_names(tls_llm, tmp_path):
    server, ca = tls_llm
    server.script(text("over TLS"))
    done = _run(tmp_path, server.url_openai, SSL_CERT_FILE=str(ca))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "over TLS"
    assert len(server.requests) == 1
    # A live run awaits its calls on aiohttp; httpx (and the command-line modules
    # its package loads: rich, pygments) is not imported for it.
    modules = _imported(done.stderr)
    assert "aiohttp" in modules
    assert "httpx" not in modules and "pygments" not in modules


def test_a_live_call_trusts_a_ca_directory_the_environment_names(tls_llm, tmp_path):
    """SSL_CERT_DIR (no SSL_CERT_FILE): a directory of CA certificates under their
    subject-hash names, as ``openssl rehash`` lays them out."""
    server, ca = tls_llm
    folder = tmp_path / "certs"
    folder.mkdir()
    subject_hash = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(ca)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (folder / f"{subject_hash}.0").write_bytes(ca.read_bytes())
    server.script(text("over TLS, from a directory"))
    done = _run(tmp_path, server.url_openai, SSL_CERT_DIR=str(folder))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "over TLS, from a directory"
    # An empty directory vouches for nobody: the same server is refused.
    empty = tmp_path / "empty"
    empty.mkdir()
    server.script(text("never"))
    refused = _run(tmp_path, server.url_openai, SSL_CERT_DIR=str(empty))
    assert refused.returncode != 0
    assert "certificate" in refused.stderr.lower(), refused.stderr[-2000:]


def test_a_live_call_refuses_a_server_no_trusted_ca_vouches_for(tls_llm, tmp_path):
    """Without SSL_CERT_FILE, certifi's bundle is trusted, and it does not hold the
    test's CA: the call fails on the certificate, saying so (not as a system error
    of the same number), it is not retried, and nothing is answered."""
    server, _ = tls_llm
    server.script(text("never read"))
    done = _run(tmp_path, server.url_openai)
    # The llm node failed and routed on (Loki's rule): completed with errors.
    assert done.returncode == 4, done.stderr[-2000:]
    failure = next(line for line in done.stderr.splitlines() if "▸ ask failed" in line)
    assert "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed" in failure
    assert "Errno" not in failure and "gave up after" not in failure
    assert server.requests == []


def test_an_embedding_request_names_the_tls_failure(tls_llm, monkeypatch):
    """A rag request (blocking or awaited) to a server no trusted CA vouches for is
    described by what TLS said, not as the system error of the same number."""
    import httpx

    from graphrun.actors.llm.client import shared_ssl_context
    from graphrun.actors.loop import EffectLoop
    from graphrun.actors.rag.http import describe, json_post, loop_client, post_awaited, tls

    server, _ = tls_llm
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    shared_ssl_context.cache_clear()
    url = f"{server.url_openai}/embeddings"
    post = json_post({"model": "m", "input": ["x"]}, "sk-test", 5.0)
    loop = EffectLoop("tls-test-loop")
    try:
        with httpx.Client(verify=tls()) as client, pytest.raises(httpx.ConnectError) as blocked:
            client.post(url, **post)

        async def awaited(client: Any) -> httpx.ConnectError:
            with pytest.raises(httpx.ConnectError) as failed:
                await post_awaited(client, url, **post)
            return failed.value

        on_loop = loop.submit(awaited(loop_client(loop))).result(timeout=30)
        for exc in (blocked.value, on_loop):
            said = describe(exc)
            assert "CERTIFICATE_VERIFY_FAILED" in said, said
            assert "Errno" not in said
    finally:
        loop.stop()
        shared_ssl_context.cache_clear()
    assert server.requests == []
