"""Knowledge-base documents: turn a rag node's ``documents`` entries into text.

A ``documents`` entry is one of:

- a file (``./knowledge/faq.md``), a folder (``./knowledge/``, read recursively,
  hidden files and folders skipped) or a glob (``./docs/**/*.md``); relative
  entries resolve against the agent directory; every file must lie inside it
  once ``..`` and symlinks are resolved, unless the user allows more
  (``GRAPHRUN_ALLOWED_ROOTS``, ``GRAPHRUN_ALLOW_OUTSIDE_PATHS=1``; see
  :mod:`graphrun.actors.paths`): a graph must not index any readable file;
- a URL (``http://`` or ``https://``), fetched with httpx; HTML is reduced to text;
- a loader-protocol path (``git:https://...``) when a loader command is configured
  for its protocol: the command (``$1`` stands for the resource) prints the text.

Text and markdown (and any UTF-8 file), HTML and PDF (with the optional ``pypdf``
dependency: ``pip install 'graphrun[pdf]'``) are understood. Every resulting
:class:`LoadedDocument` keeps the source string as written, or for a file found
in a folder or by a glob, that entry's prefix plus the file's relative path
(``./knowledge/sub/a.md``), so retrieval can cite it.

Anything wrong with an entry (missing path, binary or unreadable file, failing
URL) is a :class:`RagError` naming the entry; files in folders that are not text
are skipped and listed in :attr:`LoadResult.skipped` instead, so a folder of docs
with images in it still loads.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graphrun.actors import process
from graphrun.actors.paths import outside_hint, outside_problem
from graphrun.eventstore.errors import GraphrunError

#: Extensions read as PDF or HTML; everything else must be UTF-8 text.
PDF_EXTENSIONS = frozenset({"pdf"})
HTML_EXTENSIONS = frozenset({"html", "htm", "xhtml"})

_GLOB_CHARS = frozenset("*?[")
_URL_PREFIXES = ("http://", "https://")
_SNIFF_BYTES = 8192
_URL_TIMEOUT_S = 30.0
_LOADER_TIMEOUT_S = 120.0


class RagError(GraphrunError):
    """A knowledge base cannot be loaded, built or queried.

    ``node_id``, when given, prefixes the message so the user knows which rag
    node is affected.
    """

    def __init__(
        self,
        message: str,
        *,
        node_id: str | None = None,
        hint: str | None = None,
        where: str | None = None,
    ):
        if node_id:
            message = f"rag node '{node_id}': {message}"
        super().__init__(message, hint=hint, where=where)
        self.node_id = node_id


@dataclass(frozen=True)
class SourceRef:
    """One concrete thing to load, found from a ``documents`` entry.

    Attributes:
        source: What chunks cite: the entry as written, or for files under a
            folder or glob, the entry's prefix joined with the relative path.
        entry: The ``documents`` entry this came from.
        path: The absolute file path, for files.
        url: The URL, for URLs.
        loader: The loader command, for loader-protocol paths.
        in_collection: True for files found in a folder or by a glob (those that
            are not text are skipped rather than failing the build).
    """

    source: str
    entry: str
    path: Path | None = None
    url: str | None = None
    loader: str | None = None
    in_collection: bool = False

    @property
    def extension(self) -> str:
        """The lowercase file extension without the dot ("" if none)."""
        name = self.path.name if self.path is not None else (self.url or "").split("?")[0]
        suffix = os.path.splitext(name)[1]
        return suffix[1:].lower() if suffix else ""


@dataclass(frozen=True)
class LoadedDocument:
    """The text of one source, with what is needed to detect changes later."""

    source: str
    entry: str
    text: str
    extension: str
    sha256: str
    path: str | None = None


@dataclass
class LoadResult:
    """Documents loaded from a ``documents`` list, and the folder files skipped."""

    documents: list[LoadedDocument] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def is_url(entry: str) -> bool:
    """Whether a ``documents`` entry is an http(s) URL."""
    return entry.strip().lower().startswith(_URL_PREFIXES)


def _loader_protocol(entry: str, loaders: Mapping[str, str]) -> str | None:
    protocol, sep, _ = entry.partition(":")
    if sep and protocol in loaders and len(protocol) > 1:  # "C:" is a drive, not a protocol
        return protocol
    return None


def resolve_sources(
    documents: Sequence[str],
    agent_dir: Path,
    *,
    node_id: str | None = None,
    loaders: Mapping[str, str] | None = None,
) -> list[SourceRef]:
    """Expand ``documents`` entries into files, URLs and loader calls, in order.

    Folders and globs expand to their files sorted by path; a file reached twice
    is kept once (first entry wins).

    Raises:
        RagError: an entry is empty, a path does not exist, or a glob matches
            nothing.
    """
    loaders = loaders or {}
    refs: list[SourceRef] = []
    seen: set[str] = set()

    def add(ref: SourceRef) -> None:
        key = str(ref.path) if ref.path is not None else ref.source
        if key not in seen:
            seen.add(key)
            refs.append(ref)

    for raw in documents:
        entry = raw.strip() if isinstance(raw, str) else ""
        if not entry:
            raise RagError(
                f"documents has an empty entry ({raw!r})",
                node_id=node_id,
                hint="give a file, folder, glob or URL",
            )
        if is_url(entry):
            if entry.endswith("**"):
                raise RagError(
                    f"document '{entry}': recursive website crawling is not supported",
                    node_id=node_id,
                    hint="list the pages to load one URL per entry",
                )
            add(SourceRef(source=entry, entry=entry, url=entry))
            continue
        protocol = _loader_protocol(entry, loaders)
        if protocol is not None:
            add(SourceRef(source=entry, entry=entry, loader=loaders[protocol]))
            continue
        for ref in _resolve_local(entry, agent_dir, node_id):
            add(ref)
    return refs


def _resolve_local(entry: str, agent_dir: Path, node_id: str | None) -> list[SourceRef]:
    """The files of a local entry, each checked against the path rule
    (:mod:`graphrun.actors.paths`): the entry itself, and every file it reaches
    (a symlink inside a folder may point anywhere)."""
    refs = _expand_local(entry, agent_dir, node_id)
    for ref in refs:
        assert ref.path is not None
        what = f"document '{entry}'" + ("" if ref.source == entry else f" (file {ref.source})")
        problem = outside_problem(agent_dir, ref.path, what=what)
        if problem is not None:
            raise RagError(problem, node_id=node_id, hint=outside_hint())
    return refs


def document_problem(entry: str, agent_dir: Path) -> str | None:
    """Why a local ``documents`` entry would be refused for its paths, or ``None``
    (``validate`` asks this; a missing file is the run's to report)."""
    protocol, colon, _rest = entry.partition(":")
    if is_url(entry) or (colon and len(protocol) > 1 and "/" not in protocol):
        return None  # a URL or a loader-protocol path: not a file of this machine
    try:
        _resolve_local(entry.strip(), agent_dir, None)
    except RagError as exc:
        return exc.message if "outside" in exc.message else None
    except OSError:
        return None
    return None


def _expand_local(entry: str, agent_dir: Path, node_id: str | None) -> list[SourceRef]:
    expanded = os.path.expanduser(entry)
    base = Path(expanded) if os.path.isabs(expanded) else Path(agent_dir).resolve() / expanded
    problem = outside_problem(agent_dir, base, what=f"document '{entry}'")
    if problem is not None:  # before looking at what is there
        raise RagError(problem, node_id=node_id, hint=outside_hint())
    if any(ch in _GLOB_CHARS for ch in entry):
        return _resolve_glob(entry, expanded, agent_dir, node_id)
    if base.is_dir():
        prefix = entry if entry.endswith("/") else entry + "/"
        return [
            SourceRef(source=prefix + rel, entry=entry, path=path, in_collection=True)
            for rel, path in sorted(_walk_visible(base))
        ]
    if base.is_file():
        return [SourceRef(source=entry, entry=entry, path=base.resolve())]
    raise RagError(
        f"document '{entry}' not found (looked for {base})",
        node_id=node_id,
        hint="fix the path in documents; relative paths resolve against the agent directory",
    )


def _walk_visible(root: Path) -> list[tuple[str, Path]]:
    """The visible files under ``root``: (path relative to ``root`` as written, real
    path). ``root`` may hold ``..`` or be a symlink: the relative part is taken
    before anything is resolved."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith("."):
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path.resolve()))
    return found


def _resolve_glob(
    entry: str, expanded: str, agent_dir: Path, node_id: str | None
) -> list[SourceRef]:
    # The part of the pattern before the first wildcard component is what the
    # cited source keeps as written; the match's path below it is appended.
    parts = expanded.replace(os.sep, "/").split("/")
    fixed: list[str] = []
    for part in parts:
        if any(ch in _GLOB_CHARS for ch in part):
            break
        fixed.append(part)
    written_parts = entry.split("/")[: len(fixed)]
    prefix = "/".join(written_parts) + "/" if written_parts else ""
    root_rel = "/".join(fixed)
    root = Path(root_rel) if os.path.isabs(expanded) else agent_dir / root_rel
    pattern = expanded if os.path.isabs(expanded) else str(agent_dir / expanded)
    matches = sorted(
        Path(m).resolve()
        for m in glob.glob(pattern, recursive=True)
        if os.path.isfile(m) and not Path(m).name.startswith(".")
    )
    if not matches:
        raise RagError(
            f"document '{entry}' matches no files",
            node_id=node_id,
            hint="check the glob; relative patterns resolve against the agent directory",
        )
    root = root.resolve()
    refs = []
    for m in matches:
        try:
            rel = m.relative_to(root).as_posix()
        except ValueError:  # a match outside the fixed prefix (via ..): cite it absolutely
            refs.append(SourceRef(source=str(m), entry=entry, path=m, in_collection=True))
            continue
        refs.append(SourceRef(source=prefix + rel, entry=entry, path=m, in_collection=True))
    return refs


def sha256_of_file(path: Path) -> str:
    """The sha256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _Skip(Exception):
    """A file found in a folder is not text: skip it, don't fail the build."""


def load_source(ref: SourceRef, *, node_id: str | None = None) -> LoadedDocument:
    """Read one source and return its text.

    Raises:
        RagError: the file is missing, unreadable, binary or a bad PDF, or the
            URL or loader command fails.
    """
    try:
        if ref.url is not None:
            return _load_url(ref, node_id)
        if ref.loader is not None:
            return _load_with_loader(ref, node_id)
        return _load_file(ref, node_id)
    except _Skip as skip:
        raise RagError(f"document '{ref.source}' {skip}", node_id=node_id) from None


def load_documents(
    documents: Sequence[str],
    agent_dir: Path,
    *,
    node_id: str | None = None,
    loaders: Mapping[str, str] | None = None,
) -> LoadResult:
    """Resolve and read every ``documents`` entry.

    Files found in folders or by globs that are not text (binary, not UTF-8)
    are skipped and reported in ``skipped``; every other problem is an error.

    Raises:
        RagError: see :func:`resolve_sources` and :func:`load_source`.
    """
    result = LoadResult()
    for ref in resolve_sources(documents, agent_dir, node_id=node_id, loaders=loaders):
        if ref.in_collection:
            try:
                result.documents.append(_load_file(ref, node_id))
            except _Skip as skip:
                result.skipped.append((ref.source, str(skip)))
            continue
        result.documents.append(load_source(ref, node_id=node_id))
    return result


def _load_file(ref: SourceRef, node_id: str | None) -> LoadedDocument:
    assert ref.path is not None
    try:
        data = ref.path.read_bytes()
    except FileNotFoundError:
        raise RagError(f"document '{ref.source}' not found ({ref.path})", node_id=node_id) from None
    except OSError as exc:
        raise RagError(
            f"document '{ref.source}' cannot be read: {exc.strerror or exc}",
            node_id=node_id,
            hint="check the file's permissions",
        ) from None
    ext = ref.extension
    if ext in PDF_EXTENSIONS:
        text = pdf_to_text(data, ref.source, node_id=node_id)
    elif ext in HTML_EXTENSIONS:
        text = html_to_text(_decode_text(data))
    else:
        text = _decode_text(data)
    return LoadedDocument(
        source=ref.source,
        entry=ref.entry,
        text=text,
        extension=ext,
        sha256=hashlib.sha256(data).hexdigest(),
        path=str(ref.path),
    )


def _decode_text(data: bytes) -> str:
    if b"\x00" in data[:_SNIFF_BYTES]:
        raise _Skip("is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _Skip("is not UTF-8 text") from None


def pdf_to_text(data: bytes, source: str, *, node_id: str | None = None) -> str:
    """Extract the text of a PDF, page by page, with pypdf (imported lazily).

    Raises:
        RagError: pypdf is not installed, or the PDF cannot be read.
    """
    try:
        import pypdf
    except ImportError:
        raise RagError(
            f"document '{source}' is a PDF, and reading PDFs needs pypdf",
            node_id=node_id,
            hint="pip install 'graphrun[pdf]'",
        ) from None
    import io
    import logging

    # pypdf logs recoverable oddities of real-world PDFs as warnings; they are noise here.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise RagError(
                f"document '{source}' is an encrypted PDF",
                node_id=node_id,
                hint="decrypt it or provide a text version",
            )
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except RagError:
        raise
    except Exception as exc:  # pypdf raises many types for damaged files
        raise RagError(
            f"document '{source}' is not a readable PDF: {exc}", node_id=node_id
        ) from None
    return "\n\n".join(p for p in pages if p)


_DROP_TAGS = ("script", "style", "noscript", "template", "svg", "head")
_BLOCK_TAGS = (
    "p", "div", "section", "article", "main", "header", "footer", "nav", "aside",
    "h1", "h2", "h3", "h4", "h5", "h6", "li", "ul", "ol", "table", "tr", "pre",
    "blockquote", "br", "hr", "dd", "dt", "figcaption",
)  # fmt: skip


def html_to_text(html: str) -> str:
    """Reduce an HTML page to readable text (BeautifulSoup, stdlib parser).

    Scripts, styles and the head are dropped; block elements become paragraph
    breaks; a ``<title>`` becomes the first line.
    """
    import warnings

    from bs4 import BeautifulSoup, MarkupResemblesLocatorWarning

    with warnings.catch_warnings():
        # Short pages that look like a file name or URL trigger a hint meant for people.
        warnings.simplefilter("ignore", MarkupResemblesLocatorWarning)
        soup = BeautifulSoup(html, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup(_DROP_TAGS):
        tag.decompose()
    for tag in soup.find_all(_BLOCK_TAGS):
        tag.insert_before("\n\n")
        tag.insert_after("\n\n")
    raw = soup.get_text()
    paragraphs: list[str] = []
    for block in raw.split("\n\n"):
        line = " ".join(block.split())
        if line:
            paragraphs.append(line)
    if title and (not paragraphs or paragraphs[0] != title):
        paragraphs.insert(0, title)
    return "\n\n".join(paragraphs)


def _load_url(ref: SourceRef, node_id: str | None) -> LoadedDocument:
    import httpx

    assert ref.url is not None
    try:
        with httpx.Client(timeout=_URL_TIMEOUT_S, follow_redirects=True) as client:
            response = client.get(ref.url, headers={"User-Agent": "graphrun"})
    except httpx.HTTPError as exc:
        raise RagError(
            f"document '{ref.source}' could not be fetched: {exc}",
            node_id=node_id,
            hint="check the URL and the network",
        ) from None
    if response.status_code >= 400:
        raise RagError(
            f"document '{ref.source}' could not be fetched: HTTP {response.status_code}",
            node_id=node_id,
            hint="check the URL",
        )
    data = response.content
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    ext = ref.extension
    if content_type == "application/pdf" or ext in PDF_EXTENSIONS:
        text, ext = pdf_to_text(data, ref.source, node_id=node_id), "pdf"
    else:
        try:
            decoded = data.decode(response.encoding or "utf-8", errors="replace")
        except LookupError:  # an unknown charset name in the header
            decoded = data.decode("utf-8", errors="replace")
        if (
            "html" in content_type
            or ext in HTML_EXTENSIONS
            or (not content_type and decoded.lstrip()[:1] == "<")
        ):
            text, ext = html_to_text(decoded), "html"
        else:
            text = decoded
    return LoadedDocument(
        source=ref.source,
        entry=ref.entry,
        text=text,
        extension=ext,
        sha256=hashlib.sha256(data).hexdigest(),
    )


def _load_with_loader(ref: SourceRef, node_id: str | None) -> LoadedDocument:
    assert ref.loader is not None
    _, _, resource = ref.source.partition(":")
    command = ref.loader.replace("$1", shlex.quote(resource))
    try:
        proc = process.run(
            [command],
            shell=True,
            env=process.inherited_environment(),
            timeout=_LOADER_TIMEOUT_S,
        )
    except OSError as exc:
        raise RagError(
            f"document '{ref.source}': loader command could not start: {exc}",
            node_id=node_id,
        ) from None
    if proc.timed_out:
        raise RagError(
            f"document '{ref.source}': loader command timed out after {_LOADER_TIMEOUT_S:.0f}s",
            node_id=node_id,
        )
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()
        detail = f": {stderr[-1]}" if stderr else ""
        raise RagError(
            f"document '{ref.source}': loader command exited {proc.returncode}{detail}",
            node_id=node_id,
            hint=f"the command was: {command}",
        )
    text = proc.stdout.decode("utf-8", errors="replace")
    return LoadedDocument(
        source=ref.source,
        entry=ref.entry,
        text=text,
        extension="",
        sha256=hashlib.sha256(proc.stdout).hexdigest(),
    )
