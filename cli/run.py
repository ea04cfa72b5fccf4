"""``run``, ``resume``, ``approve``, ``answer``, ``cancel``, ``fork``."""

from __future__ import annotations

from typing import Any

import click

from graphrun.cli.options import (
    db_option,
    json_option,
    open_store,
    resolve_run,
    set_option,
    var_option,
)


def _parse_pairs(values: tuple[str, ...], flag: str) -> list[tuple[str, str]]:
    from graphrun.runtime.errors import UsageError

    pairs = []
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} expects KEY=VALUE, got {value!r}")
        pairs.append((key.strip(), rest))
    return pairs


#: Limits on one ``--set`` value: its size and how deep its JSON nests.
MAX_SET_BYTES = 1024 * 1024
MAX_SET_DEPTH = 64


def _json_depth(value: Any) -> int:
    """How deep lists and objects nest in a parsed JSON value (without recursion)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _parse_set(values: tuple[str, ...]) -> dict[str, Any]:
    """``--set k=v``: v is JSON when it parses as JSON, else a string."""
    import json

    from graphrun.runtime.errors import UsageError

    out: dict[str, Any] = {}
    for key, raw in _parse_pairs(values, "--set"):
        if len(raw.encode("utf-8", "surrogatepass")) > MAX_SET_BYTES:
            raise UsageError(f"--set {key}: the value is over {MAX_SET_BYTES:,} bytes")
        try:
            value = json.loads(raw)
            too_deep = _json_depth(value) > MAX_SET_DEPTH
        except RecursionError:  # deeper than Python's parser goes: over the limit too
            too_deep = True
        except ValueError:
            value, too_deep = raw, False
        if too_deep:
            raise UsageError(f"--set {key}: JSON nests deeper than {MAX_SET_DEPTH} levels")
        try:  # a JSON escape can name half a surrogate pair, which is not text
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(
                f"--set {key}: the JSON value holds a lone surrogate (a \\uD800-\\uDFFF "
                "escape without its pair), which is not text"
            ) from None
        out[key] = value
    return out


class AnswerOrderCommand(click.Command):
    """A command that keeps its raw arguments, so that ``--answer`` and ``--other``
    values for one node are used in the order they were given."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["graphrun.args"] = list(args)
        return super().parse_args(ctx, args)


def _flag_order() -> list[str]:
    """``"--answer"`` / ``"--other"`` in the order they appear on the command line."""
    ctx = click.get_current_context(silent=True)
    args = ctx.meta.get("graphrun.args", []) if ctx is not None else []
    order = []
    for arg in args:
        if arg == "--":
            break
        for flag in ("--answer", "--other"):
            if arg == flag or arg.startswith(flag + "="):
                order.append(flag)
    return order


def _answers(values: tuple[str, ...], others: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """``--answer NODE=VALUE`` and ``--other NODE=TEXT`` (free-form) answers by node,
    in the order given on the command line (a second visit takes the next)."""
    from graphrun.actors.human.prompt import FreeForm

    plain = _parse_pairs(values, "--answer")
    free = [(node, FreeForm(text)) for node, text in _parse_pairs(others, "--other")]
    order = _flag_order()
    if order.count("--answer") != len(plain) or order.count("--other") != len(free):
        order = ["--answer"] * len(plain) + ["--other"] * len(free)
    queues = {"--answer": iter(plain), "--other": iter(free)}
    answers: dict[str, list[str]] = {}
    for flag in order:
        node, text = next(queues[flag])
        answers.setdefault(node, []).append(text)
    return answers


def _options(
    *,
    answers: tuple[str, ...],
    others: tuple[str, ...] = (),
    as_user: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    llm_replay: str | None,
    store: Any,
    quiet: bool = False,
    continuing: Any = None,
) -> Any:
    """The run options of a command. ``continuing``: the run a command continues
    (its id, or the run as the command opened it:
    :class:`~graphrun.runtime.engine.runs.LoadedRun`); the configuration it began
    with is used where the command line does not say otherwise (so ``resume``,
    ``approve``, ``answer`` and ``upgrade`` need no ``--loki-dir`` the run was
    started with)."""
    from graphrun.actors.human.prompt import is_interactive
    from graphrun.runtime.engine.driver import RunOptions, recorded_config
    from graphrun.runtime.graph.config import agents_dir as resolve_agents
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.narrate import Narrator, child_narrator

    recorded: dict[str, Any] = {}
    if isinstance(continuing, str):
        recorded = recorded_config(store, continuing)
    elif continuing is not None:
        recorded = recorded_config(store, continuing.run_id, first=continuing.first)
    if config_dir is None and recorded.get("config_dir"):
        config_dir = recorded["config_dir"]
    if agents_dir is None and recorded.get("agents_dir"):
        agents_dir = recorded["agents_dir"]
    cfg = resolve_config(config_dir)
    options = RunOptions(
        answers=_answers(answers, others),
        as_user=as_user,
        interactive=is_interactive(),
        agents_dir=resolve_agents(agents_dir, config=cfg),
        config_dir=cfg,
        listener=None if quiet else Narrator(),
        child_listener=None if quiet else child_narrator,
    )
    if isinstance(recorded.get("variables"), dict):
        options.variables = dict(recorded["variables"])  # as the run began
    if llm_replay:
        from graphrun.runtime.replay.recorded import load_llm_calls

        _check_replay_source(llm_replay)

        options.llm_replay = load_llm_calls(llm_replay, store)
    return options


def _check_replay_source(source: str) -> None:
    """``--llm-replay`` names a run of the database or a file, which must exist."""
    from pathlib import Path

    from graphrun.runtime.errors import UsageError

    path = Path(source)
    if path.is_dir():
        raise UsageError(f"--llm-replay {source}: is a directory, not an exported run file")
    looks_like_file = path.suffix in (".jsonl", ".json") or "/" in source or "\\" in source
    if looks_like_file and not path.exists():
        raise UsageError(
            f"--llm-replay {source}: no such file",
            hint="give an exported run file (graphrun export RUN -o FILE) or a run id",
        )


def common_run_options(fn: Any) -> Any:
    for decorator in reversed(
        [
            click.option(
                "--answer",
                "answers",
                multiple=True,
                metavar="NODE=VALUE",
                help="Answer for an input node, or an approval's option or its number "
                "(repeatable, used in order).",
            ),
            click.option(
                "--other",
                "others",
                multiple=True,
                metavar="NODE=TEXT",
                help="Free-form answer for an approval node, routed to on_other "
                "(repeatable, used in order with --answer).",
            ),
            click.option(
                "--as",
                "as_user",
                metavar="USER",
                help="Identity recorded for human answers (default: the OS user).",
            ),
            click.option(
                "--agents-dir",
                metavar="DIR",
                envvar="GRAPHRUN_AGENTS_DIR",
                help="Agents directory (default: $GRAPHRUN_AGENTS_DIR, else <config dir>/agents).",
            ),
            click.option(
                "--config-dir",
                "--loki-dir",
                "config_dir",
                metavar="DIR",
                help="Config directory, e.g. an existing Loki config dir with agents/, "
                "functions/ and config.yaml (default: $GRAPHRUN_CONFIG_DIR, "
                "$COYOTE_CONFIG_DIR, $LOKI_CONFIG_DIR, else the first of graphrun's, "
                "Coyote's and Loki's user config dirs that exists).",
            ),
            click.option(
                "--llm-replay",
                metavar="RUN|FILE",
                help="Serve LLM responses from a recorded run or exported file (offline).",
            ),
            json_option,
            db_option,
        ]
    ):
        fn = decorator(fn)
    return fn


def _drive(driver: Any) -> Any:
    """Drive a run as every command here does: to its end or a wait."""
    from graphrun.runtime.engine.driver import drive

    return drive(driver)


def finish(outcome: Any, *, as_json: bool, db: str | None) -> None:
    """Print a run's outcome and exit with its code."""
    from graphrun.cli.render import render_outcome

    if outcome.status == "completed" and not as_json:
        # Failed and waiting runs name themselves in their message; say this one's id too.
        click.echo(f"▸ run {outcome.run_id} completed", err=True)
    raise SystemExit(render_outcome(outcome, as_json=as_json, db=db))


@click.command("run", cls=AnswerOrderCommand)
@click.argument("agent")
@click.argument("prompt", required=False, default="")
@set_option
@var_option
@common_run_options
def run_cmd(
    agent: str,
    prompt: str,
    sets: tuple[str, ...],
    var_flags: tuple[str, ...],
    answers: tuple[str, ...],
    others: tuple[str, ...],
    as_user: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    llm_replay: str | None,
    as_json: bool,
    db: str | None,
) -> None:
    """Run AGENT (a directory, a graph.yaml, or an agent name) with PROMPT.

    PROMPT becomes {{initial_prompt}}. The result goes to stdout, narration to
    stderr. Exit 0 completed, 1 failed, 2 invalid graph or input, 3 waiting for a
    person (the command that answers is printed), 4 completed with unhandled
    failures (named on stderr; see settings.on_unhandled_failure).
    """
    from graphrun.cli.render import print_diagnostics
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.driver import Driver, check_graph, run_config, start_run
    from graphrun.runtime.graph.config import resolve_agent
    from graphrun.runtime.narrate import configure_logging

    configure_logging()
    overrides = _parse_set(sets)
    from graphrun.runtime.graph.variables import parse_presets

    presets = parse_presets(var_flags)
    store = open_store(db, create=True)
    options = _options(
        answers=answers,
        others=others,
        as_user=as_user,
        agents_dir=agents_dir,
        config_dir=config_dir,
        llm_replay=llm_replay,
        store=store,
        quiet=as_json,
    )
    loaded = load_agent(resolve_agent(agent, options.agents_dir), config_dir=options.config_dir)
    if loaded.graph.settings.validate_before_run:
        print_diagnostics(
            check_graph(loaded, agents_dir=options.agents_dir, config_dir=options.config_dir)
        )
    from graphrun.runtime.graph.variables import prompt_variable, with_variables
    from graphrun.runtime.graph.variables import resolve as resolve_variables

    options.variables = resolve_variables(
        loaded, presets, ask=prompt_variable if options.interactive else None
    )
    loaded = with_variables(loaded, options.variables)
    from graphrun.runtime.engine.answers import check_flag_answers
    from graphrun.runtime.graph.preflight import check_answers, preflight

    check_answers(loaded, options.answers)
    check_flag_answers(loaded.graph.nodes, options.answers)
    preflight(loaded, options)
    if any(n.type == "rag" for n in loaded.graph.nodes.values()):
        from graphrun.runtime.nodes.rag import prepare_knowledge_bases

        options.extra["knowledge_bases"] = prepare_knowledge_bases(
            loaded, interactive=options.interactive, config_dir=options.config_dir
        )
    run_id = start_run(
        store,
        loaded,
        prompt=prompt,
        overrides=overrides,
        started_by=as_user,
        config=run_config(loaded, options),
    )
    outcome = _drive(Driver(store, run_id, options))
    finish(outcome, as_json=as_json, db=db)


@click.command("resume", cls=AnswerOrderCommand)
@click.argument("run_id")
@common_run_options
def resume_cmd(
    run_id: str,
    answers: tuple[str, ...],
    others: tuple[str, ...],
    as_user: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    llm_replay: str | None,
    as_json: bool,
    db: str | None,
) -> None:
    """Continue RUN_ID from its log: after a crash, or with --answer for a waiting node.

    An effect whose result was recorded is never performed again.
    """
    from graphrun.runtime.engine.driver import Driver
    from graphrun.runtime.engine.runs import load_run
    from graphrun.runtime.errors import AnswerError
    from graphrun.runtime.narrate import configure_logging

    configure_logging()
    store = open_store(db)
    run_id = resolve_run(store, run_id)
    run = load_run(store, run_id)  # never extend a log that does not verify
    state = run.state
    if state.status == "failed":
        raise AnswerError(
            f"run {run_id} has already failed; there is nothing to resume",
            hint=f"fix its graph, then `graphrun upgrade {run_id} --graph DIR` continues it "
            "on the fixed graph (the node that failed runs again)",
        )
    if state.terminal:
        raise AnswerError(f"run {run_id} has already {state.status}; there is nothing to resume")
    options = _options(
        answers=answers,
        others=others,
        as_user=as_user,
        agents_dir=agents_dir,
        config_dir=config_dir,
        llm_replay=llm_replay,
        store=store,
        quiet=as_json,
        continuing=run,
    )
    _check_continuation(run, options, resuming=True)
    outcome = _drive(Driver(store, run_id, options, resumed_by=as_user, loaded=run))
    finish(outcome, as_json=as_json, db=db)


def _check_continuation(run: Any, options: Any, *, resuming: bool) -> None:
    """What ``run`` checks before it starts, for a run continued from its log (as
    the command opened it): the answers given (less those the log already holds,
    on resume) and the model keys."""
    from graphrun.runtime.engine.answers import check_flag_answers, pending_answers
    from graphrun.runtime.engine.driver import graph_of
    from graphrun.runtime.graph.preflight import check_answers, preflight

    loaded = graph_of(run.state)
    if resuming:
        options.answers = pending_answers(run.events, options.answers, state=run.state)
    check_answers(loaded, options.answers)
    check_flag_answers(loaded.graph.nodes, options.answers)
    preflight(loaded, options)


def _answer_and_resume(
    kind: str,
    channel: str,
    run_id: str,
    text: str,
    as_user: str | None,
    node: str | None,
    as_json: bool,
    db: str | None,
    config_dir: str | None,
    agents_dir: str | None,
    other: bool = False,
    sign: str | None = None,
    signers: str | None = None,
) -> None:
    from graphrun.eventstore.events import ApprovalSigned
    from graphrun.runtime.engine.answers import answer_run
    from graphrun.runtime.engine.driver import Driver
    from graphrun.runtime.engine.runs import load_run
    from graphrun.runtime.errors import UsageError
    from graphrun.runtime.narrate import configure_logging

    configure_logging()
    if sign is None and as_user is None:
        raise UsageError(
            f"graphrun {channel} needs --as USER (a claim) or --sign KEY (a signed answer)"
        )
    store = open_store(db)
    run_id = resolve_run(store, run_id)
    # The run is read and verified once here; the checks, the answer and the
    # driver that continues it all take it from here.
    run = load_run(store, run_id)
    signed, trust = None, None
    if sign is not None:
        signed, trust = _signed_answer(
            store, run, text, kind, as_user, node, other, sign, signers, config_dir
        )
    received, answered = answer_run(
        store,
        run_id,
        text,
        kind=kind,
        as_user=as_user,
        node=node,
        channel=channel,
        other=other,
        signed=signed,
        trust=trust,
        loaded=run,
    )
    if received.run_id != run_id:
        click.echo(f"▸ run {run_id} waits on its child run {received.run_id}", err=True)
    # The answer may belong to a child run the given run waits on: continue that
    # one, and its parents after it.
    run_id = received.run_id
    how = f"signed by {received.by} ({received.key})" if received.key else f"from {received.by}"
    if isinstance(received, ApprovalSigned):
        from graphrun.runtime.decisions.heads import sign_head

        try:
            sign_head(store, run_id)
        finally:
            store.release_lease(run_id)
        click.echo(
            f"▸ recorded {received.answer!r} {how} at node '{received.node_id}' "
            f"(seq {received.seq}); the run waits for more signatures",
            err=True,
        )
        if as_json:
            import json

            click.echo(
                json.dumps({"run_id": run_id, "status": "waiting", "signature_seq": received.seq})
            )
        return
    click.echo(
        f"▸ recorded {received.answer!r} {how} at node '{received.node_id}' (seq {received.seq})",
        err=True,
    )
    queued = getattr(store, "queued", None)
    entry = queued(run_id) if queued is not None else None
    if entry is not None:
        # A run workers drive: the answer queued it again (in its transaction);
        # whichever worker is free continues it.
        store.release_lease(run_id)
        click.echo(f"▸ run {entry['run_id']} is queued for a worker", err=True)
        if as_json:
            import json

            click.echo(json.dumps({"run_id": entry["run_id"], "status": "queued"}))
        return
    options = _options(
        answers=(),
        as_user=as_user,
        agents_dir=agents_dir,
        config_dir=config_dir,
        llm_replay=None,
        store=store,
        quiet=as_json,
        continuing=answered,
    )
    # This command answers one question: the run goes on to its end or to the
    # next wait, which is answered by another command, not prompted for here.
    options.interactive = False
    if trust is not None:
        options.signers = trust.signers
    outcome = _drive(Driver(store, run_id, options, resumed_by=as_user, loaded=answered))
    from graphrun.runtime.engine.driver import resume_ancestors

    outcome = resume_ancestors(store, run_id, options, outcome)
    finish(outcome, as_json=as_json, db=db)


def _signed_answer(
    store: Any,
    run: Any,
    text: str,
    kind: str,
    as_user: str | None,
    node: str | None,
    other: bool,
    sign: str,
    signers: str | None,
    config_dir: str | None,
) -> tuple[Any, Any]:
    """``--sign KEY``: the decision statement for this answer, signed with KEY as the
    principal the signers file lists for it (``--as`` picks one when it lists several)."""
    from graphrun.actors.human.actor import AnswerRefused
    from graphrun.runtime.decisions import SignedDecision, make_trust
    from graphrun.runtime.decisions.sshsig import find_signers, principals_of
    from graphrun.runtime.decisions.sshsig import sign as ssh_sign
    from graphrun.runtime.engine.answers import prepare_statement
    from graphrun.runtime.errors import UsageError
    from graphrun.runtime.graph.config import config_dir as default_config_dir

    run_id = run.run_id
    found = find_signers(
        signers,
        graph_dir=run.first.agent_dir or None,
        config_dir=default_config_dir(config_dir),
    )
    if found is None:
        raise UsageError(
            "--sign needs an allowed_signers file to name the signer",
            hint="pass --signers FILE, or put allowed_signers next to graph.yaml or in the "
            "config directory",
        )
    principals = principals_of(sign, found)
    if not principals:
        raise AnswerRefused(
            f"--sign {sign}: the key is not listed in {found}; nothing was recorded"
        )
    if as_user is not None:
        if as_user not in principals:
            raise AnswerRefused(
                f"--as {as_user!r}: {found} lists this key for {', '.join(principals)}, "
                "not for them; nothing was recorded"
            )
        principal = as_user
    elif len(principals) == 1:
        principal = principals[0]
    else:
        raise UsageError(
            f"--sign {sign}: {found} lists this key for {', '.join(principals)}",
            hint="pick one with --as NAME",
        )
    _waiting, statement = prepare_statement(
        store, run_id, text, kind=kind, principal=principal, node=node, other=other, loaded=run
    )
    signature = ssh_sign(statement, sign)
    return SignedDecision(statement, signature, "sshsig"), make_trust(found)


_SIGN_HELP = (
    "Sign the answer with this SSH key: a private key file, or a public key file "
    "whose private key is in ssh-agent. Its principal in the signers file is the answerer."
)
_SIGNERS_HELP = (
    "The allowed_signers file (OpenSSH format) naming who may sign as whom; default: "
    "allowed_signers next to graph.yaml, else in the config directory."
)


@click.command("approve")
@click.argument("run_id")
@click.argument("choice", required=False)
@click.option(
    "--other",
    metavar="TEXT",
    help="A free-form answer instead of a CHOICE (routed to on_other).",
)
@click.option(
    "--as", "as_user", metavar="USER", help="Who approves (a claim, unless --sign proves it)."
)
@click.option("--sign", metavar="KEY", help=_SIGN_HELP)
@click.option("--signers", metavar="FILE", help=_SIGNERS_HELP)
@click.option("--node", metavar="NODE", help="The approval node (when it matters).")
@click.option("--agents-dir", metavar="DIR", envvar="GRAPHRUN_AGENTS_DIR", help="Agents directory.")
@click.option("--config-dir", "--loki-dir", "config_dir", metavar="DIR", help="Config directory.")
@json_option
@db_option
def approve_cmd(
    run_id: str,
    choice: str | None,
    other: str | None,
    as_user: str | None,
    sign: str | None,
    signers: str | None,
    node: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    as_json: bool,
    db: str | None,
) -> None:
    """Answer the approval node RUN_ID waits at with CHOICE, then continue the run.

    CHOICE is one of the node's options or its number (1, 2, ... as the terminal
    menu shows them); anything else is refused and nothing is recorded. A
    free-form answer goes with --other TEXT instead (routed to on_other). The
    answer is recorded with --as, the OS user and the host. With --sign KEY the
    answer is a signed decision statement (SSHSIG); a graph that requires signed
    decisions refuses anything else.
    """
    from graphrun.runtime.errors import UsageError

    if (choice is None) == (other is None):
        raise UsageError(
            "approve takes a CHOICE or --other TEXT (one of them)",
            hint=f"graphrun approve {run_id} <option|number> --as USER, "
            f'or graphrun approve {run_id} --other "TEXT" --as USER',
        )
    text = choice if choice is not None else other
    assert text is not None
    _answer_and_resume(
        "approval",
        "approve",
        run_id,
        text,
        as_user,
        node,
        as_json,
        db,
        config_dir,
        agents_dir,
        other=other is not None,
        sign=sign,
        signers=signers,
    )


@click.command("answer")
@click.argument("run_id")
@click.argument("text")
@click.option(
    "--as", "as_user", metavar="USER", help="Who answers (a claim, unless --sign proves it)."
)
@click.option("--sign", metavar="KEY", help=_SIGN_HELP)
@click.option("--signers", metavar="FILE", help=_SIGNERS_HELP)
@click.option("--node", metavar="NODE", help="The input node (when it matters).")
@click.option("--agents-dir", metavar="DIR", envvar="GRAPHRUN_AGENTS_DIR", help="Agents directory.")
@click.option("--config-dir", "--loki-dir", "config_dir", metavar="DIR", help="Config directory.")
@json_option
@db_option
def answer_cmd(
    run_id: str,
    text: str,
    as_user: str | None,
    sign: str | None,
    signers: str | None,
    node: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    as_json: bool,
    db: str | None,
) -> None:
    """Answer the input node RUN_ID waits at with TEXT, then continue the run.

    TEXT must satisfy the node's validation (an empty TEXT takes the node's
    default, if it has one); an answer that does not is refused, nothing is
    recorded and the run keeps waiting.
    """
    _answer_and_resume(
        "input",
        "answer",
        run_id,
        text,
        as_user,
        node,
        as_json,
        db,
        config_dir,
        agents_dir,
        sign=sign,
        signers=signers,
    )


@click.command("cancel")
@click.argument("run_id")
@click.option("--as", "as_user", metavar="USER", help="Who cancels.")
@click.option("--reason", default="cancelled by a person", help="Why.")
@db_option
def cancel_cmd(run_id: str, as_user: str | None, reason: str, db: str | None) -> None:
    """Cancel RUN_ID and its running child runs.

    A run that waits or was interrupted is cancelled here. A run another process
    is driving is asked to stop: that process stops its effects, records the
    cancellation and exits 1; this command waits for it (up to 30s) and exits 0
    once the run is cancelled.
    """
    from graphrun.runtime.engine.lifecycle import cancel

    store = open_store(db)
    run_id = resolve_run(store, run_id)

    def asked(lease: Any) -> None:
        holder = f" (pid {lease.pid} on {lease.host})" if lease is not None else ""
        click.echo(f"▸ asked the process driving run {run_id}{holder} to cancel it", err=True)

    cancel(store, run_id, reason=reason, by=as_user, asked=asked)
    click.echo(f"▸ run {run_id} cancelled", err=True)


@click.command("fork", cls=AnswerOrderCommand)
@click.argument("run_id")
@click.option(
    "--at",
    "at_seq",
    type=int,
    required=True,
    metavar="SEQ",
    help="Copy the source run's events up to and including SEQ.",
)
@common_run_options
def fork_cmd(
    run_id: str,
    at_seq: int,
    answers: tuple[str, ...],
    others: tuple[str, ...],
    as_user: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    llm_replay: str | None,
    as_json: bool,
    db: str | None,
) -> None:
    """Start a new run whose history is RUN_ID's events up to SEQ, and continue it.

    The new run records where it was forked from. Continue live, or with
    --answer for a different human decision.
    """
    from graphrun.runtime.engine.driver import Driver
    from graphrun.runtime.engine.runs import load_run
    from graphrun.runtime.narrate import configure_logging
    from graphrun.runtime.replay.fork import fork_run

    configure_logging()
    store = open_store(db)
    run_id = resolve_run(store, run_id)
    source = load_run(store, run_id)  # a fork copies only a log that verifies
    options = _options(
        answers=answers,
        others=others,
        as_user=as_user,
        agents_dir=agents_dir,
        config_dir=config_dir,
        llm_replay=llm_replay,
        store=store,
        quiet=as_json,
        continuing=source,
    )
    _check_continuation(source, options, resuming=False)
    new_id = fork_run(store, run_id, at_seq, by=as_user, source=source)
    click.echo(f"▸ forked {run_id} at seq {at_seq} as {new_id}", err=True)
    forked = load_run(store, new_id)
    reused = [e for e in forked.events if getattr(e, "signature", "") and hasattr(e, "by")]
    if reused:
        signers = ", ".join(dict.fromkeys(str(getattr(e, "by", "")) for e in reused))
        click.echo(
            f"▸ the fork reuses {len(reused)} signed answer(s) of run {run_id} ({signers}): "
            "kept as signed for that run, not signed again",
            err=True,
        )
    outcome = _drive(Driver(store, new_id, options, resumed_by=as_user, loaded=forked))
    finish(outcome, as_json=as_json, db=db)
