"""The canonical codec and the hash chain: every event type round-trips."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.eventstore import codec, events
from graphrun.eventstore.events import Event, NodeCompleted, RunStarted

EVENT_TYPES: list[type] = list(typing.get_args(Event))

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy for one event field's annotated type."""
    origin = typing.get_origin(tp)
    if tp is str:
        return st.text(max_size=20)
    if tp is int:
        return st.integers(min_value=-(2**31), max_value=2**31)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False, width=64)
    if tp is bool:
        return st.booleans()
    if tp is Any:
        return json_values
    if origin in (typing.Union, types.UnionType):
        return st.one_of([strategy_for(arg) for arg in typing.get_args(tp)])
    if tp is type(None):
        return st.none()
    if origin is dict:
        key, value = typing.get_args(tp)
        return st.dictionaries(strategy_for(key), strategy_for(value), max_size=3)
    if origin is list:
        (item,) = typing.get_args(tp)
        return st.lists(strategy_for(item), max_size=3)
    raise AssertionError(f"no strategy for {tp!r}")


def event_strategy(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls, vars(events))
    fields = {name: strategy_for(hints[name]) for name in cls.__struct_fields__}
    return st.builds(cls, **fields)


any_event = st.one_of([event_strategy(cls) for cls in EVENT_TYPES])


def test_the_union_has_every_event_class() -> None:
    declared = {
        obj
        for obj in vars(events).values()
        if isinstance(obj, type)
        and issubclass(obj, events.EventBase)
        and obj is not events.EventBase
    }
    assert set(EVENT_TYPES) == declared
    assert len(EVENT_TYPES) == 31


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_every_event_type_round_trips(cls: type, data: st.DataObject) -> None:
    event = data.draw(event_strategy(cls))
    body = codec.encode(event)
    back = codec.decode(body)
    assert back == event
    assert type(back) is cls
    # Canonical: re-encoding gives the same bytes, and the tag names the type.
    assert codec.encode(back) == body
    assert json.loads(body)["type"] == cls.__name__
    assert codec.from_builtins(codec.to_builtins(event)) == event


@settings(max_examples=40, deadline=None)
@given(value=json_objects)
def test_encoding_sorts_keys_whatever_the_insertion_order(value: dict[str, Any]) -> None:
    reversed_value = dict(reversed(list(value.items())))
    a = NodeCompleted(node_id="n", visit=1, routed_to=None, updates=value)
    b = NodeCompleted(node_id="n", visit=1, routed_to=None, updates=reversed_value)
    assert codec.encode(a) == codec.encode(b)
    assert codec.encode_any(value) == codec.encode_any(reversed_value)


def test_canonical_bytes_are_stable() -> None:
    event = NodeCompleted(
        run_id="r",
        seq=3,
        ts=1.5,
        node_id="n",
        visit=1,
        routed_to="m",
        updates={"b": 1, "a": [True, None]},
    )
    assert codec.encode(event) == (
        b'{"node_id":"n","routed_to":"m","run_id":"r","seq":3,"ts":1.5,"type":"NodeCompleted",'
        b'"updates":{"a":[true,null],"b":1},"visit":1}'
    )


def test_old_readers_skip_unknown_fields_and_defaults_fill_missing_ones() -> None:
    body = (
        b'{"type":"RunStarted","run_id":"r","seq":1,"graph_name":"g","graph_source":"s",'
        b'"graph_hash":"h","a_field_from_the_future":{"x":1}}'
    )
    event = codec.decode(body)
    assert isinstance(event, RunStarted)
    assert event.initial_state == {} and event.files == {} and event.parent_run_id is None


def test_decode_errors_are_msgspec_errors() -> None:
    with pytest.raises(msgspec.ValidationError):
        codec.decode(b'{"type":"NoSuchEvent","run_id":"r"}')
    with pytest.raises(msgspec.DecodeError):
        codec.decode(b"{not json")


def chain(bodies: list[bytes]) -> list[tuple[int, bytes, str, str]]:
    rows = []
    prev = codec.GENESIS
    for seq, body in enumerate(bodies, 1):
        digest = codec.chain_hash(prev, body)
        rows.append((seq, body, prev, digest))
        prev = digest
    return rows


def bodies_of(n: int) -> list[bytes]:
    return [
        codec.encode(NodeCompleted(run_id="r", seq=i, node_id="n", visit=i, routed_to=None))
        for i in range(1, n + 1)
    ]


def test_chain_hash_format_and_genesis() -> None:
    digest = codec.chain_hash(codec.GENESIS, b"{}")
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
    assert codec.GENESIS == "sha256:" + "0" * 64
    assert codec.content_hash("abc") == codec.content_hash(b"abc")
    assert codec.chain_hash(codec.GENESIS, b"{}") != codec.chain_hash(digest, b"{}")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 8), data=st.data())
def test_verify_names_the_first_changed_event(n: int, data: st.DataObject) -> None:
    rows = chain(bodies_of(n))
    assert codec.verify_chain(rows) is None
    k = data.draw(st.integers(1, n))
    pos = data.draw(st.integers(0, len(rows[k - 1][1]) - 1))
    seq, body, prev, digest = rows[k - 1]
    changed = bytearray(body)
    changed[pos] = (changed[pos] + 1) % 256
    rows[k - 1] = (seq, bytes(changed), prev, digest)
    problem = codec.verify_chain(rows)
    assert problem is not None and problem.seq == k


def test_verify_finds_gaps_relinks_and_wrong_seq() -> None:
    rows = chain(bodies_of(4))
    gap = codec.verify_chain([rows[0], rows[2], rows[3]])
    assert gap == codec.ChainProblem(2, "missing event (next stored seq is 3)")
    relinked = [
        rows[0],
        (2, rows[1][1], codec.GENESIS, codec.chain_hash(codec.GENESIS, rows[1][1])),
    ]
    assert codec.verify_chain(relinked) == codec.ChainProblem(
        2, "prev_hash does not match the previous event's hash"
    )
    # A body that hashes right but claims another seq (re-chained by a forger).
    liar = chain([bodies_of(1)[0], bodies_of(1)[0]])
    assert codec.verify_chain(liar) == codec.ChainProblem(2, "event body says seq 1")
    garbage = chain([bodies_of(1)[0], b"{oops"])
    problem = codec.verify_chain(garbage)
    assert problem is not None and problem.seq == 2 and "does not decode" in problem.reason


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_light_read_keeps_an_llm_calls_wire_bodies_as_their_stored_json(
    data: st.DataObject,
) -> None:
    import gc

    from graphrun.runtime.replay.divergence import Divergence, _decision_divergence

    fields = {
        f: data.draw(strategy_for(t), label=f)
        for f, t in typing.get_type_hints(events.LlmCalled).items()
        if f not in ("run_id", "seq", "ts")
    }
    stored = codec.encode(events.LlmCalled(run_id="r", seq=3, ts=1.0, **fields))
    full, problem = codec.read_body(stored, "r", 3)
    light, light_problem = codec.read_body(stored, "r", 3, light=True)
    assert problem is None and light_problem is None
    assert isinstance(light, events.LlmCalled) and isinstance(full, events.LlmCalled)
    # Undecoded: no dict or list for the collector; the same bytes when encoded again.
    for name in ("request", "response", "tool_calls"):
        raw = getattr(light, name)
        assert isinstance(raw, msgspec.Raw)
        assert msgspec.json.decode(raw) == getattr(full, name)
    assert not gc.is_tracked(light)
    assert codec.encode(light) == stored
    assert light.text == full.text and light.usage == full.usage and light.model == full.model
    # A divergence that shows the recorded call shows its bodies as data.
    other = events.LlmResult(node_id="x", visit=1, text="now")
    found = _decision_divergence(light, other)
    assert isinstance(found, Divergence)
    shown = json.loads(json.dumps(found.as_dict()))["recorded"]
    assert shown.get("request", {}) == full.request  # (a default is left out)
    assert shown.get("response") == full.response
