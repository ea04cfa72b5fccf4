"""The fold's map of branch effects: immutable, shared structure, deterministic order."""

from __future__ import annotations

import subprocess
import sys

from graphrun.eventstore.events import LlmResult
from graphrun.eventstore.fold import BranchEffects, RunState, fold


def test_set_returns_a_new_map_and_leaves_the_old_one_alone() -> None:
    empty = BranchEffects()
    one = empty.set("m[0]", ("a",))
    two = one.set("m[1]", ("b",)).set("m[0]", ("a", "c"))
    assert dict(empty) == {} and len(empty) == 0
    assert dict(one) == {"m[0]": ("a",)}
    assert two == {"m[0]": ("a", "c"), "m[1]": ("b",)}
    assert len(two) == 2 and "m[1]" in two and "m[2]" not in two and 3 not in two
    assert two.get("m[2]", ()) == () and two["m[1]"] == ("b",)


def test_a_map_equals_the_dict_it_was_built_from() -> None:
    items = {f"m[{i}]": (i,) for i in range(300)}
    built = BranchEffects()
    for key, value in items.items():
        built = built.set(key, value)
    assert built == items and BranchEffects(items) == built
    assert sorted(built) == sorted(items)
    # Read at once (a map collected): every entry, the latest value of each.
    changed = built.set("m[7]", (7, "again"))
    assert changed.as_dict() == {**items, "m[7]": (7, "again")}
    assert built.as_dict() == items and BranchEffects().as_dict() == {}


def test_iteration_order_is_the_same_in_every_process() -> None:
    code = (
        "from graphrun.eventstore.fold import BranchEffects as B\n"
        "m = B({f'm[{i}]': () for i in range(50)})\n"
        "print(','.join(m))"
    )
    orders = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(orders) == 1


def test_a_thousand_item_map_folds_every_effect_under_its_branch() -> None:
    events = [
        LlmResult(node_id="call", visit=1, text=str(i), branch=f"fan[{i % 1000}]", seq=i + 1)
        for i in range(2000)
    ]
    state = fold(events, RunState(status="running"))
    assert len(state.branch_effects) == 1000
    assert [e.text for e in state.branch_effects["fan[7]"]] == ["7", "1007"]
    # Folding in two halves gives the same state.
    half = fold(events[1000:], fold(events[:1000], RunState(status="running")))
    assert half == state


def test_a_set_copies_one_leaf_whatever_the_size_of_the_map() -> None:
    # Two levels of 32: an event copies two rows and one leaf of ~n/1,024 items, so
    # a 10,000-item map's fold stays linear (one level of 64 copied ~156 items).
    big = BranchEffects({f"m[{i}]": (i,) for i in range(10_000)})
    after = big.set("m[77]", (77, 78))
    old_leaves = [leaf for row in big._buckets for leaf in row]
    new_leaves = [leaf for row in after._buckets for leaf in row]
    shared = sum(a is b for a, b in zip(old_leaves, new_leaves, strict=True))
    assert len(old_leaves) == 1024 and shared == 1023
    changed = next(b for a, b in zip(old_leaves, new_leaves, strict=True) if a is not b)
    assert len(changed) <= 30  # ~10 items a leaf
    assert big["m[77]"] == (77,) and after["m[77]"] == (77, 78) and len(after) == 10_000
    # Empty leaves are one shared, never changed dict.
    empty = BranchEffects()
    assert empty.set("x", ()).get("y") is None and dict(empty) == {} and len(empty) == 0
