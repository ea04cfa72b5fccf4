"""The console: a Starlette application over the event store.

Pages (runs, a run, the inbox, sign-in) and a JSON API under ``/api/`` are thin:
each reads through :mod:`graphrun.cli.console.listing` or the store, or answers
through :mod:`graphrun.cli.console.decide`. Who is asking comes from a session
cookie (a passkey sign-in), an API token (``Authorization: Bearer``), or, when a
deployment says so, an identity header set by a trusted reverse proxy.

Security: every template autoescapes (run data is untrusted: prompts, model
output, state); a strict Content-Security-Policy allows only the console's own
script and styles; a run's report is shown in a sandboxed frame with no script;
every state-changing request must come from the console's own origin (``Origin``)
and, with a session, carry the session's CSRF token; cookies are ``Secure``,
``HttpOnly`` and ``SameSite=Strict``; sign-in and registration are rate-limited per
client address.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from graphrun.actors.terminal import terminal_safe
from graphrun.cli.console.accounts import Accounts, Passkey
from graphrun.cli.console.listing import STATUSES, inbox, list_runs, may_answer, run_line

HERE = Path(__file__).parent
SESSION_COOKIE = "graphrun_session"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'self'"
)


def _report_csp() -> str:
    """A report page may run its own expand/collapse script (pinned by hash) and
    nothing else, in a sandbox with an opaque origin (no cookies, no parent)."""
    import base64

    from graphrun.runtime.observe.report import SCRIPT

    pin = base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode()
    return (
        f"default-src 'none'; script-src 'sha256-{pin}'; style-src 'unsafe-inline'; "
        "img-src data:; sandbox allow-scripts"
    )


PENDING_SECONDS = 300


@dataclass
class Config:
    """How one console is served."""

    db: str
    origin: str  # e.g. http://localhost:8765 (scheme, host, port: what browsers send)
    base_path: str = ""
    proxy_header: str | None = None  # trusted identity header (SSO), when configured
    trusted_proxies: tuple[str, ...] = ("127.0.0.1",)
    signers: Path | None = None  # an allowed_signers file also trusted for answers

    @property
    def rp_id(self) -> str:
        from urllib.parse import urlsplit

        return urlsplit(self.origin).hostname or "localhost"


@dataclass
class Who:
    """The person (or integration) a request comes from, and how that is known."""

    principal: str
    how: str  # "session", "token" or "proxy"
    csrf: str = ""
    credential_ids: list[str] = field(default_factory=list)


class RateLimit:
    """At most ``count`` attempts per ``seconds`` from one client address."""

    def __init__(self, count: int = 10, seconds: float = 60.0) -> None:
        self.count, self.seconds = count, seconds
        self._hits: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            hits = self._hits.setdefault(key, deque())
            while hits and hits[0] < now - self.seconds:
                hits.popleft()
            if len(hits) >= self.count:
                return False
            hits.append(now)
            return True


class Console:
    """The application's state: the store, the accounts, what waits for a signature."""

    def __init__(self, config: Config) -> None:
        from graphrun.cli.options import open_store

        self.config = config
        self.store = open_store(config.db, create=True)
        self.accounts = Accounts(config.db)
        self.read_lock = threading.Lock()
        self.secret = secrets.token_bytes(32)  # CSRF tokens of proxy-signed-in people
        self.sign_in_limit = RateLimit()
        self.challenges: dict[str, tuple[str, bytes, str, float]] = {}
        self.pending: dict[str, tuple[float, Any]] = {}
        self.problems: list[str] = []  # runs continued here that failed to continue
        from graphrun.runtime.graph.config import config_dir
        from graphrun.runtime.observe.usage import load_prices

        self.prices = load_prices(config_dir(None))

    def close(self) -> None:
        self.store.close()
        self.accounts.close()

    # -- who asks ------------------------------------------------------------------

    def who(self, request: Request) -> Who | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            principal = self.accounts.token_principal(auth[7:].strip())
            return Who(principal, "token") if principal else None
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            session = self.accounts.session(cookie)
            if session is not None:
                ids = [p.credential_id for p in self.accounts.passkeys(session.account)]
                return Who(session.account, "session", session.csrf, ids)
        header = self.config.proxy_header
        client = request.client.host if request.client else ""
        if header and client in self.config.trusted_proxies:
            name = request.headers.get(header, "").strip()
            if name:
                csrf = hmac.new(self.secret, name.encode(), hashlib.sha256).hexdigest()
                return Who(name, "proxy", csrf)
        return None

    def same_origin(self, request: Request) -> bool:
        return request.headers.get("origin") == self.config.origin

    def trust(self, signers: Path | None) -> Any:
        """What answers are verified against: each account's registered passkeys and
        the run's allowed_signers file."""
        from graphrun.cli.console.passkeys import ssh_public_key
        from graphrun.runtime.decisions import Trust

        keys: dict[str, list[str]] = {}
        for key in self.accounts.passkeys():
            keys.setdefault(key.account, []).append(ssh_public_key(key.public_key, key.rp_id))
        return Trust(signers=signers, extra={"webauthn": keys})

    def remember(self, value: Any) -> str:
        now = time.monotonic()
        for key, (at, _v) in list(self.pending.items()):
            if at < now - PENDING_SECONDS:
                del self.pending[key]
        key = secrets.token_urlsafe(24)
        self.pending[key] = (now, value)
        return key

    def recall(self, key: str) -> Any:
        found = self.pending.pop(key, None)
        if found is None or found[0] < time.monotonic() - PENDING_SECONDS:
            return None
        return found[1]


# -- templates and responses ---------------------------------------------------------------


def _templates() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = _when
    # Text a run brings (a question, an option, an answer, an error), shown with its
    # control and bidirectional-override characters written out: what a person
    # decides on reads as it is (autoescaping already makes it inert HTML).
    env.filters["shown"] = terminal_safe
    env.filters["seconds"] = _seconds
    env.filters["tojson_pretty"] = lambda v: json.dumps(
        v, indent=2, ensure_ascii=False, sort_keys=True, default=str
    )
    return env


def _when(ts: float | None) -> str:
    if not ts:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def _secure_headers(response: Response, csp: str = CSP) -> Response:
    response.headers["Content-Security-Policy"] = csp
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def _error(status: int, message: str, hint: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message}
    if hint:
        body["hint"] = hint
    return JSONResponse(body, status_code=status)


def create_app(config: Config) -> Starlette:
    """The console's ASGI application."""
    console = Console(config)
    env = _templates()
    base = config.base_path.rstrip("/")

    def page(
        request: Request, name: str, who: Who | None, status: int = 200, **ctx: Any
    ) -> Response:
        body = env.get_template(name).render(
            base=base, who=who, csrf=who.csrf if who else "", **ctx
        )
        return _secure_headers(HTMLResponse(body, status_code=status))

    def signin_redirect(request: Request) -> Response:
        return RedirectResponse(f"{base}/signin", status_code=303)

    async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def read(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with console.read_lock:
            return fn(*args, **kwargs)

    # -- pages -----------------------------------------------------------------------

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{base}/runs", status_code=303)

    async def runs_page(request: Request) -> Response:
        who = console.who(request)
        if who is None:
            return signin_redirect(request)
        q = request.query_params
        status = q.get("status") or None
        if status and status not in STATUSES:
            status = None
        listed = await in_thread(
            read,
            list_runs,
            console.store,
            status=status,
            agent=q.get("agent") or None,
            search=(q.get("q") or "").strip() or None,
            cursor=q.get("after") or None,
            prices=console.prices,
        )
        return page(request, "runs.html", who, page_=listed, statuses=STATUSES, q=dict(q))

    async def run_page(request: Request) -> Response:
        who = console.who(request)
        if who is None:
            return signin_redirect(request)
        run_id = request.path_params["run_id"]
        from graphrun.eventstore.errors import GraphrunError

        try:
            line = await in_thread(read, run_line, console.store, run_id, console.prices)
        except GraphrunError:
            return page(request, "missing.html", who, status=404, run_id=run_id)
        answerable = line.waiting is not None and may_answer(line.waiting, who.principal)
        decisions = await in_thread(read, _decisions, console.store, run_id)
        return page(
            request,
            "run.html",
            who,
            line=line,
            answerable=answerable,
            decisions=decisions,
            shown=_shown(line.waiting) if line.waiting else "",
        )

    async def run_report(request: Request) -> Response:
        who = console.who(request)
        if who is None:
            return PlainTextResponse("sign in first", status_code=401)
        from graphrun.eventstore.errors import GraphrunError
        from graphrun.runtime.observe.report import build_report

        run_id = request.path_params["run_id"]
        try:
            text = await in_thread(read, build_report, console.store, run_id, prices=console.prices)
        except GraphrunError as exc:  # an unknown or damaged run: say so, in the frame
            import html

            text = f"<p>no report: {html.escape(str(exc))}</p>"
        return _secure_headers(HTMLResponse(text), _report_csp())

    async def run_graph(request: Request) -> Response:
        who = console.who(request)
        if who is None:
            return PlainTextResponse("sign in first", status_code=401)
        run_id = request.path_params["run_id"]
        from graphrun.eventstore.errors import GraphrunError

        try:
            svg = await in_thread(read, _graph_svg, console.store, run_id)
        except GraphrunError as exc:  # an unknown run, or Graphviz missing
            return PlainTextResponse(f"no picture: {exc}", status_code=404)
        response = Response(svg, media_type="image/svg+xml")
        return _secure_headers(response, "default-src 'none'; style-src 'unsafe-inline'")

    async def run_live(request: Request) -> Response:
        who = console.who(request)
        if who is None:
            return PlainTextResponse("sign in first", status_code=401)
        from sse_starlette.sse import EventSourceResponse

        run_id = request.path_params["run_id"]
        from graphrun.eventstore.errors import GraphrunError

        try:
            await in_thread(read, console.store.run, run_id)
        except GraphrunError as exc:
            return PlainTextResponse(str(exc), status_code=404)

        async def changes() -> Any:
            last: tuple[Any, ...] | None = None
            while True:
                if await request.is_disconnected():
                    return
                row = await in_thread(read, console.store.run, run_id)
                now = (row.status, row.last_seq, row.waiting_node, row.current_node)
                if now != last:
                    last = now
                    yield {
                        "event": "run",
                        "data": json.dumps(
                            {
                                "status": row.status,
                                "last_seq": row.last_seq,
                                "current_node": row.current_node,
                                "waiting_node": row.waiting_node,
                            }
                        ),
                    }
                await asyncio.sleep(0.3)

        return EventSourceResponse(changes(), ping=15)

    async def inbox_page(request: Request) -> Response:
        who = console.who(request)
        if who is None:
            return signin_redirect(request)
        waits = await in_thread(read, inbox, console.store, who.principal)
        return page(
            request,
            "inbox.html",
            who,
            waits=waits,
            shown={w.run_id: _shown(w.request) for w in waits},
        )

    async def signin_page(request: Request) -> Response:
        return page(request, "signin.html", console.who(request))

    async def invite_page(request: Request) -> Response:
        secret = request.path_params["token"]
        account = await in_thread(console.accounts.invited, secret)
        return page(request, "invite.html", None, account=account, token=secret)

    async def signout(request: Request) -> Response:
        who = console.who(request)
        form = await request.form()
        if who is None or not console.same_origin(request) or not _same(form.get("csrf"), who.csrf):
            return _error(403, "sign-out refused: not from the console's own page")
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            await in_thread(console.accounts.close_session, cookie)
        response = RedirectResponse(f"{base}/signin", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=base or "/", secure=True, httponly=True)
        return response

    # -- passkeys --------------------------------------------------------------------

    def limited(request: Request) -> Response | None:
        now = time.monotonic()
        for key, found in list(console.challenges.items()):
            if found[3] < now - 300:  # a registration or sign-in never finished
                del console.challenges[key]
        if not console.same_origin(request):
            return _error(403, "refused: the request does not come from the console's origin")
        client = request.client.host if request.client else "?"
        if not console.sign_in_limit.allow(client):
            return _error(429, "too many sign-in attempts; wait a minute")
        return None

    async def register_options(request: Request) -> Response:
        refused = limited(request)
        if refused:
            return refused
        from webauthn import generate_registration_options, options_to_json
        from webauthn.helpers.cose import COSEAlgorithmIdentifier
        from webauthn.helpers.structs import (
            AuthenticatorSelectionCriteria,
            ResidentKeyRequirement,
            UserVerificationRequirement,
        )

        body = await _json(request)
        secret = str(body.get("token", ""))
        account = await in_thread(console.accounts.invited, secret)
        if account is None:
            return _error(403, "this invitation link is not valid (used, expired or unknown)")
        options = generate_registration_options(
            rp_id=config.rp_id,
            rp_name="graphrun",
            user_name=account,
            user_id=hashlib.sha256(account.encode()).digest()[:16],
            authenticator_selection=AuthenticatorSelectionCriteria(
                resident_key=ResidentKeyRequirement.REQUIRED,
                user_verification=UserVerificationRequirement.PREFERRED,
            ),
            supported_pub_key_algs=[COSEAlgorithmIdentifier.ECDSA_SHA_256],
        )
        console.challenges[secret] = ("register", options.challenge, account, time.monotonic())
        return JSONResponse(json.loads(options_to_json(options)))

    async def register_verify(request: Request) -> Response:
        refused = limited(request)
        if refused:
            return refused
        from webauthn import verify_registration_response
        from webauthn.helpers.cose import COSEAlgorithmIdentifier
        from webauthn.helpers.exceptions import InvalidRegistrationResponse

        body = await _json(request)
        secret = str(body.get("token", ""))
        found = console.challenges.pop(secret, None)
        if found is None or found[0] != "register" or found[3] < time.monotonic() - 300:
            return _error(400, "no registration is under way for this link; start again")
        _kind, challenge, account, _at = found
        try:
            verified = verify_registration_response(
                credential=body.get("credential") or {},
                expected_challenge=challenge,
                expected_rp_id=config.rp_id,
                expected_origin=config.origin,
                supported_pub_key_algs=[COSEAlgorithmIdentifier.ECDSA_SHA_256],
            )
        except (InvalidRegistrationResponse, ValueError, KeyError, TypeError) as exc:
            return _error(400, f"the passkey was not accepted: {exc}")
        from graphrun.runtime.decisions.webauthn import b64url

        passkey = Passkey(
            credential_id=b64url(verified.credential_id),
            account=account,
            public_key=verified.credential_public_key,
            sign_count=verified.sign_count,
            rp_id=config.rp_id,
        )
        if not await in_thread(console.accounts.register, secret, passkey):
            return _error(403, "this invitation link was used meanwhile")
        return await _signed_in(account)

    async def _signed_in(account: str) -> Response:
        cookie, _session = await in_thread(console.accounts.open_session, account)
        response = JSONResponse({"account": account, "next": f"{base}/inbox"})
        response.set_cookie(
            SESSION_COOKIE,
            cookie,
            max_age=12 * 3600,
            path=base or "/",
            secure=True,
            httponly=True,
            samesite="strict",
        )
        return response

    async def signin_options(request: Request) -> Response:
        refused = limited(request)
        if refused:
            return refused
        from webauthn import generate_authentication_options, options_to_json
        from webauthn.helpers.structs import UserVerificationRequirement

        options = generate_authentication_options(
            rp_id=config.rp_id, user_verification=UserVerificationRequirement.PREFERRED
        )
        key = secrets.token_urlsafe(16)
        console.challenges[key] = ("signin", options.challenge, "", time.monotonic())
        return JSONResponse({"key": key, "options": json.loads(options_to_json(options))})

    async def signin_verify(request: Request) -> Response:
        refused = limited(request)
        if refused:
            return refused
        from webauthn import verify_authentication_response
        from webauthn.helpers.exceptions import InvalidAuthenticationResponse

        body = await _json(request)
        found = console.challenges.pop(str(body.get("key", "")), None)
        if found is None or found[0] != "signin" or found[3] < time.monotonic() - 300:
            return _error(400, "no sign-in is under way; start again")
        credential = body.get("credential") or {}
        passkey = await in_thread(console.accounts.passkey, str(credential.get("id", "")))
        if passkey is None:
            return _error(403, "this passkey is not registered here")
        try:
            verified = verify_authentication_response(
                credential=credential,
                expected_challenge=found[1],
                expected_rp_id=config.rp_id,
                expected_origin=config.origin,
                credential_public_key=passkey.public_key,
                credential_current_sign_count=passkey.sign_count,
            )
        except (InvalidAuthenticationResponse, ValueError, KeyError, TypeError) as exc:
            return _error(403, f"sign-in refused: {exc}")
        await in_thread(console.accounts.used, passkey.credential_id, verified.new_sign_count)
        return await _signed_in(passkey.account)

    # -- the API -----------------------------------------------------------------------

    def api_who(request: Request, *, write: bool) -> Who | Response:
        who = console.who(request)
        if who is None:
            return _error(401, "sign in, or send Authorization: Bearer <API token>")
        if write and who.how != "token":
            # A browser: the console's own origin and the session's CSRF token.
            if not console.same_origin(request):
                return _error(403, "refused: the request does not come from the console's origin")
            if not _same(request.headers.get("x-csrf-token"), who.csrf):
                return _error(403, "refused: missing or wrong CSRF token")
        return who

    async def api_runs(request: Request) -> Response:
        who = api_who(request, write=False)
        if isinstance(who, Response):
            return who
        q = request.query_params
        status = q.get("status") or None
        if status and status not in STATUSES:
            return _error(400, f"unknown status {status!r} (one of {', '.join(STATUSES)})")
        try:
            limit = max(1, min(200, int(q.get("limit", "50"))))
        except ValueError:
            return _error(400, "limit must be a number")
        listed = await in_thread(
            read,
            list_runs,
            console.store,
            status=status,
            agent=q.get("agent") or None,
            search=q.get("q") or None,
            cursor=q.get("after") or None,
            limit=limit,
            prices=console.prices,
        )
        return JSONResponse(
            {"runs": [line.as_dict() for line in listed.lines], "next": listed.next_cursor}
        )

    async def api_run(request: Request) -> Response:
        who = api_who(request, write=False)
        if isinstance(who, Response):
            return who
        from graphrun.eventstore.errors import GraphrunError

        try:
            line = await in_thread(
                read, run_line, console.store, request.path_params["run_id"], console.prices
            )
        except GraphrunError as exc:
            return _error(404, str(exc))
        return JSONResponse(line.as_dict())

    async def api_events(request: Request) -> Response:
        who = api_who(request, write=False)
        if isinstance(who, Response):
            return who
        from graphrun.eventstore import codec
        from graphrun.eventstore.errors import GraphrunError

        try:
            after = int(request.query_params.get("after", "0"))
            events = await in_thread(
                read, console.store.read, request.path_params["run_id"], after=after
            )
        except (GraphrunError, ValueError) as exc:
            return _error(404, str(exc))
        return JSONResponse({"events": [json.loads(codec.encode(e)) for e in events]})

    async def api_waits(request: Request) -> Response:
        who = api_who(request, write=False)
        if isinstance(who, Response):
            return who
        waits = await in_thread(read, inbox, console.store, who.principal)
        return JSONResponse(
            {
                "waits": [
                    {
                        "run_id": w.run_id,
                        "graph_name": w.graph_name,
                        "node_id": w.request.node_id,
                        "visit": w.request.visit,
                        "kind": w.request.kind,
                        "question": w.request.question,
                        "options": list(w.request.options),
                        "approvers": list(w.request.approvers),
                        "shown": _shown(w.request),
                    }
                    for w in waits
                ]
            }
        )

    async def api_statement(request: Request) -> Response:
        """Step one of a signed answer: the statement and the passkey challenge."""
        who = api_who(request, write=True)
        if isinstance(who, Response):
            return who
        from graphrun.cli.console.decide import prepare
        from graphrun.eventstore.errors import GraphrunError

        body = await _json(request)
        try:
            prepared = await in_thread(
                read,
                prepare,
                console.store,
                request.path_params["run_id"],
                node=str(body.get("node", "")),
                visit=int(body.get("visit", 0)),
                answer=str(body.get("answer", "")),
                other=bool(body.get("other", False)),
                principal=who.principal,
            )
        except GraphrunError as exc:
            return _refused(exc)
        except (TypeError, ValueError):
            return _error(400, "node, visit and answer are required")
        key = console.remember(prepared)
        return JSONResponse(
            {
                "pending": key,
                "statement": prepared.statement.decode("utf-8"),
                "challenge": prepared.challenge,
                "allow": who.credential_ids,
            }
        )

    async def api_answer(request: Request) -> Response:
        """Record an answer: a passkey assertion over a prepared statement, or (with
        an API token, or behind a trusted proxy) the answer itself."""
        who = api_who(request, write=True)
        if isinstance(who, Response):
            return who
        from graphrun.cli.console.decide import (
            continue_run,
            prepare,
            record,
            require_listed,
            signers_file,
        )
        from graphrun.cli.console.passkeys import ssh_public_key
        from graphrun.cli.options import open_store
        from graphrun.eventstore.errors import GraphrunError
        from graphrun.runtime.decisions.webauthn import Assertion, sshsig_armored

        run_id = request.path_params["run_id"]
        body = await _json(request)
        if body.get("pending"):
            # A signed answer over a statement this console prepared (step one).
            prepared = console.recall(str(body.get("pending", "")))
            if prepared is None or prepared.run_id != run_id:
                return _error(400, "no statement is waiting for this signature; answer again")
            if prepared.principal != who.principal:
                return _error(403, f"that statement is not {who.principal}'s to sign")
            identity = "verified"
            if body.get("credential"):
                try:
                    assertion = Assertion.from_browser(body.get("credential") or {})
                except ValueError as exc:
                    return _error(400, str(exc))
                if assertion.origin() != config.origin:
                    return _error(403, "the passkey signed for another site; nothing was recorded")
                passkey = await in_thread(console.accounts.passkey, assertion.credential_id)
                if passkey is None or passkey.account != who.principal:
                    return _error(
                        403, f"that passkey is not {who.principal}'s; nothing was recorded"
                    )
                from graphrun.runtime.decisions import DOMAIN

                key_line = ssh_public_key(passkey.public_key, passkey.rp_id)
                signature, kind = sshsig_armored(assertion, key_line, DOMAIN), "webauthn"
                try:
                    await in_thread(
                        read,
                        require_listed,
                        console.store,
                        prepared,
                        key_line,
                        await in_thread(read, signers_file, console.store, run_id, config.signers),
                    )
                except GraphrunError as exc:
                    return _refused(exc)
            elif body.get("signature"):
                signature = str(body.get("signature"))
                kind = str(body.get("kind") or "sshsig")
            else:
                return _error(400, "a signed answer needs credential (a passkey) or signature")
        else:
            try:
                prepared = await in_thread(
                    read,
                    prepare,
                    console.store,
                    run_id,
                    node=str(body.get("node", "")),
                    visit=int(body.get("visit", 0)),
                    answer=str(body.get("answer", "")),
                    other=bool(body.get("other", False)),
                    principal=who.principal,
                )
            except GraphrunError as exc:
                return _refused(exc)
            except (TypeError, ValueError):
                return _error(400, "node, visit and answer are required")
            if who.how == "session":  # may answer, but a person's answer here is signed
                return _error(
                    400,
                    "an answer from the console is signed by your passkey; nothing was recorded",
                    hint="POST /statement first, then the passkey's assertion with its pending id",
                )
            signature, kind = "", ""
            identity = "token" if who.how == "token" else "proxy"

        def answer() -> Any:
            store = open_store(config.db)
            try:
                signers = signers_file(store, prepared.run_id, config.signers)
                received, answered = record(
                    store,
                    prepared,
                    signature=signature,
                    kind=kind,
                    identity=identity,
                    trust=console.trust(signers),
                )
            except BaseException:
                store.close()
                raise
            state = continue_run(
                store,
                received,
                principal=who.principal,
                signers=signers,
                on_error=_log_problem,
                loaded=answered,
            )
            return received, state

        def _log_problem(exc: BaseException) -> None:
            # The answer is recorded; the run stays where it is, resumable as any.
            line = f"run {prepared.run_id} was answered but could not continue here: {exc}"
            console.problems.append(line)
            print(f"graphrun console: {line}", file=sys.stderr, flush=True)

        try:
            received, state = await in_thread(answer)
        except GraphrunError as exc:
            return _refused(exc)
        return JSONResponse(
            {
                "run_id": received.run_id,
                "node_id": received.node_id,
                "answer": received.answer,
                "by": received.by,
                "identity": identity,
                "seq": received.seq,
                "run": state,
            }
        )

    async def api_submit(request: Request) -> Response:
        who = api_who(request, write=True)
        if isinstance(who, Response):
            return who
        from graphrun.cli.console.submit import submit
        from graphrun.eventstore.errors import GraphrunError

        body = await _json(request)
        try:
            run_id, state = await in_thread(
                submit,
                config.db,
                agent=str(body.get("agent", "")),
                prompt=str(body.get("prompt", "")),
                state=body.get("set") or {},
                principal=who.principal,
            )
        except GraphrunError as exc:
            return _error(400 if exc.exit_code == 2 else 409, str(exc), exc.hint)
        return JSONResponse({"run_id": run_id, "status": state}, status_code=201)

    async def openapi(request: Request) -> Response:
        from graphrun.cli.console.openapi import document

        return JSONResponse(document(base))

    async def no_icon(request: Request) -> Response:
        return Response(status_code=204)

    routes = [
        Route("/", home),
        Route("/favicon.ico", no_icon),
        Route("/runs", runs_page),
        Route("/runs/{run_id}", run_page),
        Route("/runs/{run_id}/report", run_report),
        Route("/runs/{run_id}/graph.svg", run_graph),
        Route("/runs/{run_id}/live", run_live),
        Route("/inbox", inbox_page),
        Route("/signin", signin_page),
        Route("/signout", signout, methods=["POST"]),
        Route("/invite/{token}", invite_page),
        Route("/auth/register/options", register_options, methods=["POST"]),
        Route("/auth/register/verify", register_verify, methods=["POST"]),
        Route("/auth/signin/options", signin_options, methods=["POST"]),
        Route("/auth/signin/verify", signin_verify, methods=["POST"]),
        Route("/api/openapi.json", openapi),
        Route("/api/runs", api_runs),
        Route("/api/runs", api_submit, methods=["POST"]),
        Route("/api/runs/{run_id}", api_run),
        Route("/api/runs/{run_id}/events", api_events),
        Route("/api/waits", api_waits),
        Route("/api/runs/{run_id}/statement", api_statement, methods=["POST"]),
        Route("/api/runs/{run_id}/answer", api_answer, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=[Mount(base, routes=routes)] if base else routes)
    app.state.console = console
    return app


def _same(given: Any, expected: str) -> bool:
    return bool(expected) and isinstance(given, str) and hmac.compare_digest(given, expected)


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _refused(exc: Any) -> JSONResponse:
    """A refused answer: 403 for who may not answer, 409 for a run that moved on,
    400 for an answer that is not one of the options."""
    from graphrun.actors.human.actor import AnswerRefused
    from graphrun.runtime.decisions import SignatureInvalid

    name = type(exc).__name__
    if isinstance(exc, AnswerRefused | SignatureInvalid) or "Refused" in name:
        status = 403
    elif name == "InvalidAnswer":
        status = 400
    else:
        status = 409
    return _error(status, str(exc.message if hasattr(exc, "message") else exc), exc.hint)


def _shown(request: Any) -> str:
    from graphrun.cli.console.decide import shown_for

    return shown_for(request)


def _decisions(store: Any, run_id: str) -> list[Any]:
    from graphrun.eventstore.events import HumanInputReceived

    return [e for e in store.read(run_id) if isinstance(e, HumanInputReceived)]


def _graph_svg(store: Any, run_id: str) -> str:
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.engine.driver import graph_of
    from graphrun.runtime.observe.graphpic import build_picture, dot_to_svg, run_path, to_dot

    events = store.read(run_id)
    state = fold(events)
    loaded = graph_of(state)
    pic = build_picture(loaded.graph, loaded.agent_dir, run_path(events))
    pic.run_id = run_id
    if not state.terminal:
        pic.current = state.waiting.node_id if state.waiting else state.current
    return dot_to_svg(to_dot(pic))


__all__ = ["Config", "Console", "create_app"]
