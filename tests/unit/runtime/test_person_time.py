"""The time a person is asked stops a run's clock, and its ancestors' clocks."""

from __future__ import annotations

import math

from graphrun.runtime.engine.driver import Deadline, PersonTime


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_moves_on_by_the_time_a_person_is_asked() -> None:
    ticks = Ticks()
    person = PersonTime(ticks)
    deadline = Deadline(2.0, person, ticks)
    ticks.now += 1.0
    with person.asking():
        ticks.now += 30.0
        assert person.now and not deadline.passed()
        assert deadline.left() == math.inf  # the clock stands still meanwhile
    assert not person.now and person.total() == 30.0
    assert deadline.left() == 1.0
    ticks.now += 0.5
    assert deadline.left() == 0.5
    ticks.now += 0.5
    assert deadline.passed()


def test_time_asked_before_a_deadline_began_is_not_credited_to_it() -> None:
    ticks = Ticks()
    person = PersonTime(ticks)
    with person.asking():
        ticks.now += 10.0
    deadline = Deadline(2.0, person, ticks)
    assert deadline.left() == 2.0
    ticks.now += 2.0
    assert deadline.passed()


def test_a_child_runs_question_stops_its_parents_clock_and_two_overlap_once() -> None:
    ticks = Ticks()
    parent = PersonTime(ticks)
    first, second = PersonTime(ticks, parent=parent), PersonTime(ticks, parent=parent)
    deadline = Deadline(5.0, parent, ticks)
    with first.asking():
        assert deadline.left() == math.inf  # a child's question stops the parent's clock
        ticks.now += 4.0
        with second.asking():  # two child runs of a parallel step ask at once
            ticks.now += 6.0
        ticks.now += 1.0
    assert (first.total(), second.total(), parent.total()) == (11.0, 6.0, 11.0)
    assert deadline.left() == 5.0
