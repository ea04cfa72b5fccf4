"""``graphrun serve``: the web console over the event store."""

from __future__ import annotations

import click

from graphrun.cli.options import db_option


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8765, show_default=True, help="Port (0: any free port).")
@click.option(
    "--base-path", default="", metavar="PATH", help="Serve under PATH (behind a reverse proxy)."
)
@click.option(
    "--origin",
    metavar="URL",
    help="The URL people open (scheme://host[:port]); passkeys are bound to its host "
    "(default: http://localhost:PORT).",
)
@click.option(
    "--invite",
    "invites",
    multiple=True,
    metavar="NAME",
    help="Print a one-time link that registers NAME's passkey (repeatable).",
)
@click.option(
    "--token",
    "tokens",
    multiple=True,
    metavar="NAME",
    help="Print a new API token bound to principal NAME (repeatable).",
)
@click.option(
    "--export-signers",
    is_flag=True,
    help="Print an allowed_signers line for every registered passkey, and exit.",
)
@click.option(
    "--signers",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="The allowed_signers file signed answers are checked against (default: next "
    "to the run's graph, else in the config directory).",
)
@click.option(
    "--proxy-header",
    metavar="HEADER",
    help="Trust this identity header from --trusted-proxy (SSO); such answers are "
    "recorded as proxy-asserted.",
)
@click.option(
    "--trusted-proxy",
    "trusted_proxies",
    multiple=True,
    metavar="ADDRESS",
    help="Address of the reverse proxy whose --proxy-header is trusted (default 127.0.0.1).",
)
@click.option("--no-serve", is_flag=True, help="Print invitations and tokens, then exit.")
@db_option
def serve_cmd(
    host: str,
    port: int,
    base_path: str,
    origin: str | None,
    invites: tuple[str, ...],
    tokens: tuple[str, ...],
    export_signers: bool,
    signers: str | None,
    proxy_header: str | None,
    trusted_proxies: tuple[str, ...],
    no_serve: bool,
    db: str | None,
) -> None:
    """Serve the web console: runs, a live view of each run, and an inbox where
    people sign in with a passkey and sign their decisions.

    The first account comes from --invite NAME (a one-time link); answers given
    in the browser are signed by the person's passkey and verified by
    `graphrun audit --verify` against allowed_signers lines that
    --export-signers prints.
    """
    import socket
    from pathlib import Path

    from graphrun.cli.console.accounts import Accounts
    from graphrun.runtime.decisions import DOMAIN
    from graphrun.runtime.errors import UsageError

    base = "/" + base_path.strip("/") if base_path.strip("/") else ""
    if any(c in base for c in "?#\\ ") or "//" in base:
        raise UsageError(f"--base-path {base_path!r}: give a plain path such as /console")
    for account in (*invites, *tokens):
        if not account.strip() or any(c.isspace() or c in ",*?!\"'" for c in account):
            raise UsageError(f"{account!r}: a principal is one word (as allowed_signers names it)")
    name = _name_db(db)
    if export_signers:
        from graphrun.cli.console.passkeys import allowed_signers_line

        accounts = Accounts(name)
        for key in accounts.passkeys():
            click.echo(allowed_signers_line(key.account, key.public_key, key.rp_id, DOMAIN))
        accounts.close()
        return
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    if not no_serve:
        # Listening before the address is printed: a client that connects at once
        # waits in the backlog until the server accepts (never "connection refused").
        sock.listen(2048)
    port = sock.getsockname()[1]
    if origin is None:
        shown_host = "localhost" if host in ("127.0.0.1", "::1", "localhost") else host
        origin = f"http://{shown_host}:{port}"
    origin = origin.rstrip("/")
    if not origin.startswith(("http://", "https://")):
        raise UsageError(f"--origin {origin!r}: give scheme://host[:port]")
    accounts = Accounts(name)
    for account in invites:
        secret = accounts.invite(account)
        click.echo(f"invitation for {account}: {origin}{base}/invite/{secret}")
    for principal in tokens:
        click.echo(f"API token for {principal}: {accounts.new_token(principal)}")
    accounts.close()
    if no_serve:
        sock.close()
        return
    import uvicorn

    from graphrun.cli.console.app import Config, create_app

    app = create_app(
        Config(
            db=name,
            origin=origin,
            base_path=base,
            proxy_header=proxy_header,
            trusted_proxies=trusted_proxies or ("127.0.0.1",),
            signers=Path(signers) if signers else None,
        )
    )
    click.echo(f"graphrun console: {origin}{base}/  (listening on {host}:{port})", err=False)
    import sys

    sys.stdout.flush()
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", proxy_headers=False, lifespan="off")
    )
    try:
        server.run(sockets=[sock])
    finally:
        app.state.console.close()


def _name_db(db: str | None) -> str:
    """The database as the store functions take it (a URL, or an SQLite path)."""
    from graphrun.cli.options import db_url
    from graphrun.runtime.graph.config import db_path

    url = db_url(db)
    return url if url is not None else str(db_path(db))


__all__ = ["serve_cmd"]
