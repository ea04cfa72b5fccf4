"""Split document text into overlapping chunks for embedding.

The algorithm is LangChain's ``RecursiveCharacterTextSplitter``, with the
per-extension separator lists Loki's RAG splitter uses: try the most structural
separator first (a markdown heading, a ``def``), split on it, merge the pieces
back up to ``chunk_size`` characters with about ``chunk_overlap`` characters of
overlap, and recurse with the next separator into any piece still too long.

Separators are literal strings. As in Loki, when any separator of a list has a
non-whitespace character (code and markdown lists do), separators are kept, at
the start of the piece that follows them; otherwise (plain text) they are
dropped at the split and put back when pieces are merged. Lengths are counted
in characters (Loki counts UTF-8 bytes; the difference only matters for
non-ASCII text and only shifts where a chunk ends).
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_SEPARATORS: tuple[str, ...] = ("\n\n", "\n", " ", "")

_TAIL = ("\n\n", "\n", " ", "")


def _code(keywords: str) -> tuple[str, ...]:
    """Separators for a programming language: a new line starting with each keyword."""
    return tuple(f"\n{k.replace('_', ' ')} " for k in keywords.split()) + _TAIL


_LATEX_ENVIRONMENTS: tuple[str, ...] = ("enumerate", "itemize", "description", "list", "quote")
_LATEX_ENVIRONMENTS += ("quotation", "verse", "verbatim", "align")

# Loki's per-language lists (which follow LangChain's). In _code lists, "_"
# stands for a space inside one keyword ("do_while" is "\ndo while ").
_LANGUAGE_SEPARATORS: dict[str, tuple[str, ...]] = {
    "cpp": _code("class void int float double if for while switch case"),
    "go": _code("func var const type if for switch case"),
    "java": _code("class public protected private static if for while switch case"),
    "js": _code("function const let var class if for while switch case default"),
    "php": _code("function class if foreach while do switch case"),
    "proto": _code("message service enum option import syntax"),
    "python": ("\nclass ", "\ndef ", "\n\tdef ", *_TAIL),
    "rst": ("\n===\n", "\n---\n", "\n***\n", "\n.. ", *_TAIL),
    "ruby": _code("def class if unless while for do begin rescue"),
    "rust": _code("fn const let if while for loop match"),
    "scala": _code("class object def val var if for while match case"),
    "swift": _code("func class struct enum if for while do switch case"),
    "markdown": (
        *("\n## ", "\n### ", "\n#### ", "\n##### ", "\n###### ", "```\n\n"),
        *("\n\n***\n\n", "\n\n---\n\n", "\n\n___\n\n"),
        *_TAIL,
    ),
    "latex": (
        *("\n\\chapter{", "\n\\section{", "\n\\subsection{", "\n\\subsubsection{"),
        *("\n\\begin{" + env + "}" for env in _LATEX_ENVIRONMENTS),
        *("$$", "$"),
        *_TAIL,
    ),
    "sol": _code(
        "pragma using contract interface library constructor type function event modifier "
        "error struct enum if for while do_while assembly"
    ),
}

_EXTENSION_LANGUAGE: dict[str, str] = {
    "c": "cpp", "cc": "cpp", "cpp": "cpp", "h": "cpp", "hpp": "cpp",
    "go": "go", "java": "java", "js": "js", "mjs": "js", "cjs": "js", "ts": "js",
    "php": "php", "proto": "proto", "py": "python", "rst": "rst", "rb": "ruby",
    "rs": "rust", "scala": "scala", "swift": "swift", "md": "markdown", "mkd": "markdown",
    "markdown": "markdown", "mdx": "markdown", "tex": "latex", "sol": "sol",
}  # fmt: skip


def separators_for(extension: str) -> tuple[str, ...]:
    """The separator list for a file extension (without the dot, any case).

    HTML, PDF and plain text (after conversion to text) use the defaults.
    """
    language = _EXTENSION_LANGUAGE.get(extension.lower().lstrip("."))
    return _LANGUAGE_SEPARATORS[language] if language else DEFAULT_SEPARATORS


class RecursiveSplitter:
    """Recursive character splitting into chunks of at most ``chunk_size`` characters.

    A chunk is longer than ``chunk_size`` only when a single unsplittable piece
    is (which cannot happen with ``""`` as the last separator).
    """

    def __init__(
        self,
        chunk_size: int,
        chunk_overlap: int,
        separators: Sequence[str] = DEFAULT_SEPARATORS,
    ):
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if chunk_overlap < 0 or chunk_overlap >= chunk_size:
            raise ValueError(
                f"chunk_overlap must be at least 0 and less than chunk_size "
                f"({chunk_size}), got {chunk_overlap}"
            )
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.separators = tuple(separators)
        self.keep_separator = any(not s.isspace() and s for s in self.separators)

    def split(self, text: str) -> list[str]:
        """Split ``text`` into chunks (stripped, never empty)."""
        return self._split(text, self.separators)

    def _split(self, text: str, separators: Sequence[str]) -> list[str]:
        separator = separators[-1] if separators else ""
        rest: Sequence[str] = ()
        for i, candidate in enumerate(separators):
            if candidate == "":
                separator = ""
                break
            if candidate in text:
                separator, rest = candidate, separators[i + 1 :]
                break
        pieces = _split_on(text, separator, self.keep_separator)
        joiner = "" if self.keep_separator else separator
        chunks: list[str] = []
        small: list[str] = []
        for piece in pieces:
            if len(piece) < self.chunk_size:
                small.append(piece)
                continue
            if small:
                chunks.extend(self._merge(small, joiner))
                small = []
            if rest:
                chunks.extend(self._split(piece, rest))
            else:
                chunks.append(piece)
        if small:
            chunks.extend(self._merge(small, joiner))
        return chunks

    def _merge(self, pieces: list[str], joiner: str) -> list[str]:
        """Greedily join pieces up to chunk_size, carrying a tail of ~chunk_overlap."""
        out: list[str] = []
        window: list[str] = []
        total = 0  # characters in window, counting joiners between its pieces
        jlen = len(joiner)
        for piece in pieces:
            plen = len(piece)
            if window and total + plen + jlen > self.chunk_size:
                _append_joined(out, window, joiner)
                # Drop from the front until what is left fits the overlap budget
                # and leaves room for the new piece.
                while window and (
                    total > self.chunk_overlap or total + plen + jlen > self.chunk_size
                ):
                    total -= len(window[0]) + (jlen if len(window) > 1 else 0)
                    window.pop(0)
            total += plen + (jlen if window else 0)
            window.append(piece)
        _append_joined(out, window, joiner)
        return out


def _append_joined(out: list[str], window: list[str], joiner: str) -> None:
    text = joiner.join(window).strip()
    if text:
        out.append(text)


def _split_on(text: str, separator: str, keep: bool) -> list[str]:
    if separator == "":
        return [ch for ch in text]
    parts = text.split(separator)
    if keep:
        # The separator starts the piece after it (it is a heading, a def, ...).
        parts = parts[:1] + [separator + p for p in parts[1:]]
    return [p for p in parts if p]


def split_text(
    text: str,
    *,
    chunk_size: int,
    chunk_overlap: int,
    extension: str = "",
) -> list[str]:
    """Split a document's text with the separators for its extension."""
    return RecursiveSplitter(chunk_size, chunk_overlap, separators_for(extension)).split(text)
