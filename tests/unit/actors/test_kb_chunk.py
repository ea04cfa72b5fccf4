"""Recursive character splitting with per-extension separators."""

from __future__ import annotations

import itertools

import pytest

from graphrun.actors.rag.chunk import (
    DEFAULT_SEPARATORS,
    RecursiveSplitter,
    separators_for,
    split_text,
)


def test_words_split_with_overlap() -> None:
    splitter = RecursiveSplitter(7, 3, [" "])
    assert splitter.split("foo bar baz 123") == ["foo bar", "bar baz", "baz 123"]


def test_no_overlap_when_zero() -> None:
    assert RecursiveSplitter(3, 0, [" "]).split("foo bar baz") == ["foo", "bar", "baz"]


def test_markdown_splits_at_headings_and_keeps_them() -> None:
    text = (
        "# Title\n\nIntro paragraph about things.\n\n## Install\n\n```bash\n"
        "# a comment in code\npip install thing\n```\n\nClosing words that are here to end it."
    )
    assert split_text(text, chunk_size=60, chunk_overlap=0, extension="md") == [
        "# Title\n\nIntro paragraph about things.",
        "## Install\n\n```bash\n# a comment in code\npip install thing",
        "```\n\nClosing words that are here to end it.",
    ]


def test_python_splits_at_definitions() -> None:
    code = "import os\n\ndef one():\n    return 1\n\ndef two():\n    return 2\n"
    chunks = split_text(code, chunk_size=30, chunk_overlap=0, extension="py")
    assert chunks == ["import os", "def one():\n    return 1", "def two():\n    return 2"]


def test_chunks_respect_size_and_cover_the_text() -> None:
    words = [f"word{i}" for i in range(400)]
    text = "\n\n".join(" ".join(words[i : i + 37]) for i in range(0, 400, 37))
    chunks = split_text(text, chunk_size=120, chunk_overlap=20)
    assert all(0 < len(c) <= 120 for c in chunks)
    seen = set(" ".join(chunks).split())
    assert seen == set(words)
    # Consecutive chunks inside a paragraph share words (the overlap).
    shared = sum(bool(set(a.split()) & set(b.split())) for a, b in itertools.pairwise(chunks))
    assert shared >= len(chunks) // 2


def test_a_long_unbroken_string_is_cut_by_characters() -> None:
    chunks = split_text("x" * 250, chunk_size=100, chunk_overlap=0)
    assert [len(c) for c in chunks] == [100, 100, 50]


def test_separators_per_extension() -> None:
    assert separators_for("md")[0] == "\n## "
    assert separators_for("MD") == separators_for("markdown")
    assert separators_for("py")[:3] == ("\nclass ", "\ndef ", "\n\tdef ")
    assert separators_for("sol")[-6:-4] == ("\ndo while ", "\nassembly ")
    assert separators_for("txt") == DEFAULT_SEPARATORS
    assert separators_for("") == DEFAULT_SEPARATORS


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_bad_sizes_are_rejected(size: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        RecursiveSplitter(size, overlap)
