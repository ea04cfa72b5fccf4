"""Text from outside made safe to print on a terminal.

What a run shows a person (a question an approval asks, an LLM's reply, a script's
error, a free-form answer, a graph's own strings) is untrusted: a control
character in it is a command to the terminal. ``ESC [ 2 K`` and a carriage return
rewrite the line above them, ``ESC [ 8 m`` hides what follows, an OSC sequence
retitles the window or writes a link; a bidirectional override (U+202E) shows
text in an order other than the one it has. An approver must see what they
decide on. :func:`terminal_safe` writes each such character as its escape
(``\\x1b``, ``\\u202e``), so that it shows and does nothing; line feeds and tabs
stay. The run's result on stdout is data, and is printed as it is.
"""

from __future__ import annotations

import re

#: C0 controls but tab and line feed, DEL, the C1 controls, and the Unicode
#: characters that reorder or hide text (bidirectional embeddings, overrides and
#: isolates; the line and paragraph separators a terminal may break on).
_UNSAFE = [
    *(c for c in range(0x20) if c not in (0x09, 0x0A)),
    0x7F,
    *range(0x80, 0xA0),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    0x200E,
    0x200F,
    0x061C,
    0x2028,
    0x2029,
]
_TABLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _UNSAFE}
_FIND = re.compile("[" + "".join(re.escape(chr(c)) for c in _UNSAFE) + "]")


def terminal_safe(text: object) -> str:
    """``text`` with every character a terminal would act on written as its escape."""
    value = str(text)
    # (Found first: most text has none, and a search is far cheaper than a translation.)
    return value.translate(_TABLE) if _FIND.search(value) else value


__all__ = ["terminal_safe"]
