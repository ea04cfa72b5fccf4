"""Documents -> text: files, folders, globs, PDF, HTML, loader commands, bad input."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from graphrun.actors.rag.loaders import (
    RagError,
    html_to_text,
    load_documents,
    resolve_sources,
)

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    shutil.copytree(DATA / "corpus", tmp_path / "knowledge")
    return tmp_path


def test_folder_is_read_recursively_with_sources_as_written(agent_dir: Path) -> None:
    result = load_documents(["./knowledge/"], agent_dir)
    sources = [d.source for d in result.documents]
    assert len(sources) == 20
    assert sources == sorted(sources)
    assert "./knowledge/bees/swarm-control.md" in sources
    assert "./knowledge/git/recovering-commits.txt" in sources
    doc = next(d for d in result.documents if d.source.endswith("swarm-control.md"))
    assert doc.entry == "./knowledge/"
    assert doc.extension == "md"
    assert "Pagden method" in doc.text
    assert doc.path == str((agent_dir / "knowledge/bees/swarm-control.md").resolve())
    assert len(doc.sha256) == 64


def test_folder_without_trailing_slash(agent_dir: Path) -> None:
    sources = [r.source for r in resolve_sources(["knowledge/sky"], agent_dir)]
    assert sources[0] == "knowledge/sky/choosing-telescope.md"


def test_glob_and_single_file(agent_dir: Path) -> None:
    refs = resolve_sources(["./knowledge/**/*.txt", "knowledge/bees/varroa-mites.txt"], agent_dir)
    assert [r.source for r in refs] == [
        "./knowledge/bees/varroa-mites.txt",
        "./knowledge/bikes/tire-repair.txt",
        "./knowledge/bread/baking-troubleshooting.txt",
        "./knowledge/git/recovering-commits.txt",
        "./knowledge/sky/observing-planets.txt",
    ]  # the single file was already found by the glob: kept once


def test_absolute_path_and_hidden_files(
    agent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHRUN_ALLOW_OUTSIDE_PATHS", "1")  # absolute paths need the opt-in
    (agent_dir / "knowledge" / ".notes.md").write_text("hidden")
    (agent_dir / "knowledge" / ".git").mkdir()
    (agent_dir / "knowledge" / ".git" / "HEAD").write_text("ref")
    refs = resolve_sources([str(agent_dir / "knowledge")], tmp_path / "elsewhere")
    assert len(refs) == 20
    assert refs[0].source == f"{agent_dir / 'knowledge'}/bees/hive-inspection.md"


def test_pdf_is_read_with_pypdf(tmp_path: Path) -> None:
    shutil.copy(DATA / "sample.pdf", tmp_path / "guide.pdf")
    (doc,) = load_documents(["guide.pdf"], tmp_path).documents
    assert doc.source == "guide.pdf"
    assert doc.extension == "pdf"
    assert "three parts brown to one part green" in doc.text
    assert "kills most weed seeds" in doc.text


def test_html_file_is_reduced_to_text(tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text(
        "<html><head><title>Kettles</title><style>p{color:red}</style></head>"
        "<body><h1>Descaling</h1><p>Boil <b>vinegar</b> and water.</p>"
        "<script>alert(1)</script><ul><li>Rinse twice</li></ul></body></html>"
    )
    (doc,) = load_documents(["page.html"], tmp_path).documents
    assert doc.text == "Kettles\n\nDescaling\n\nBoil vinegar and water.\n\nRinse twice"


def test_html_to_text_of_plain_words() -> None:
    assert html_to_text("just words") == "just words"


def test_missing_path_names_node_and_entry(tmp_path: Path) -> None:
    with pytest.raises(RagError) as info:
        load_documents(["./knowledge/nope.md"], tmp_path, node_id="research")
    assert str(info.value) == (
        f"rag node 'research': document './knowledge/nope.md' not found "
        f"(looked for {tmp_path / 'knowledge/nope.md'}) (fix the path in documents; "
        f"relative paths resolve against the agent directory)"
    )


def test_glob_matching_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RagError, match=r"document '\*\.md' matches no files"):
        load_documents(["*.md"], tmp_path, node_id="n")


def test_binary_file_named_explicitly_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(RagError) as info:
        load_documents(["logo.png"], tmp_path, node_id="docs")
    assert str(info.value) == "rag node 'docs': document 'logo.png' is a binary file, not text"


def test_non_utf8_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(RagError, match=r"document 'latin.txt' is not UTF-8 text"):
        load_documents(["latin.txt"], tmp_path)


def test_binary_files_in_a_folder_are_skipped_and_reported(tmp_path: Path) -> None:
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "a.md").write_text("# A\n\ntext")
    (tmp_path / "kb" / "b.png").write_bytes(b"\x89PNG\x00\x00")
    result = load_documents(["kb"], tmp_path)
    assert [d.source for d in result.documents] == ["kb/a.md"]
    assert result.skipped == [("kb/b.png", "is a binary file, not text")]


def test_damaged_pdf_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf body")
    with pytest.raises(RagError, match=r"document 'broken.pdf' is not a readable PDF"):
        load_documents(["broken.pdf"], tmp_path, node_id="n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("x")
    secret.chmod(0)
    with pytest.raises(RagError, match=r"document 'secret.md' cannot be read"):
        load_documents(["secret.md"], tmp_path)


def test_loader_protocol_runs_the_configured_command(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("loaded by a command")
    loaders = {"cat": f"cat {tmp_path}/$1"}
    (doc,) = load_documents(["cat:notes.txt"], tmp_path, loaders=loaders).documents
    assert doc.source == "cat:notes.txt"
    assert doc.text == "loaded by a command"


def test_failing_loader_command_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RagError, match=r"document 'cat:none.txt': loader command exited 1"):
        load_documents(["cat:none.txt"], tmp_path, loaders={"cat": "cat $1"}, node_id="n")


def test_empty_entry_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RagError, match=r"documents has an empty entry"):
        resolve_sources(["  "], tmp_path)
