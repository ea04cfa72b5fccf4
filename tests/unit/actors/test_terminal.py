"""terminal_safe: what a terminal would act on is written out, the rest kept."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from graphrun.actors.terminal import terminal_safe


def _acted_on(ch: str) -> bool:
    code = ord(ch)
    if ch in "\t\n":
        return False
    return (
        code < 0x20
        or 0x7F <= code < 0xA0
        or unicodedata.bidirectional(ch) in ("LRE", "RLE", "LRO", "RLO", "PDF")
        or unicodedata.bidirectional(ch) in ("LRI", "RLI", "FSI", "PDI")
        or ch in "\u200e\u200f\u061c\u2028\u2029"
    )


@given(st.text())
def test_nothing_a_terminal_acts_on_is_left(text: str) -> None:
    out = terminal_safe(text)
    assert not any(_acted_on(ch) for ch in out)
    if not any(_acted_on(ch) for ch in text):
        assert out == text  # plain text, tabs, line feeds and other scripts unchanged


def test_escapes_read_as_what_they_were() -> None:
    assert terminal_safe("a\x1b[2Kb\rc\u202ed\x9b\x7f\tx\ny") == (
        "a\\x1b[2Kb\\x0dc\\u202ed\\x9b\\x7f\tx\ny"
    )
    assert terminal_safe(None) == "None"
    assert terminal_safe("Grüße, 你好, שלום") == "Grüße, 你好, שלום"
