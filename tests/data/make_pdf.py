"""Write tests/data/sample.pdf: a two-page PDF with real text, from hand-written PDF bytes.

Run ``python tests/data/make_pdf.py`` to regenerate it; the result is committed so
tests need nothing but pypdf to read it. The text is about composting, a topic
the markdown corpus does not cover, so retrieval tests can tell it apart.
"""

from __future__ import annotations

from pathlib import Path

PAGES = [
    [
        "Home composting",
        "",
        "A compost heap turns kitchen and garden waste into humus.",
        "Mix green material, rich in nitrogen, such as grass clippings",
        "and vegetable peelings, with brown material, rich in carbon,",
        "such as dry leaves, straw and shredded cardboard.",
        "A ratio of roughly three parts brown to one part green by volume",
        "keeps the heap from turning slimy and smelly.",
    ],
    [
        "Turning and moisture",
        "",
        "Turn the heap every two weeks to let air in; the microbes that",
        "break down waste quickly need oxygen. A hot heap reaches",
        "60 degrees Celsius in its centre, which kills most weed seeds.",
        "The heap should feel as damp as a wrung-out sponge.",
        "Finished compost is dark, crumbly and smells of forest soil,",
        "usually after six to twelve months.",
    ],
]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _content(lines: list[str]) -> bytes:
    ops = ["BT", "/F1 12 Tf", "16 TL", "72 740 Td"]
    for i, line in enumerate(lines):
        ops.append(f"({_escape(line)}) Tj" if i == 0 else f"T* ({_escape(line)}) Tj")
    ops.append("ET")
    return "\n".join(ops).encode("latin-1")


def build_pdf(pages: list[list[str]]) -> bytes:
    """A minimal valid PDF 1.4 file: catalog, pages, one Helvetica font, one stream per page."""
    n = len(pages)
    # Object numbers: 1 catalog, 2 pages, 3 font, then (page, content) pairs.
    page_ids = [4 + 2 * i for i in range(n)]
    objects: dict[int, bytes] = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: (
            "<< /Type /Pages /Kids [" + " ".join(f"{p} 0 R" for p in page_ids) + f"] /Count {n} >>"
        ).encode(),
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    }
    for page_id, lines in zip(page_ids, pages, strict=True):
        stream = _content(lines)
        objects[page_id] = (
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {page_id + 1} 0 R >>"
        ).encode()
        objects[page_id + 1] = (
            f"<< /Length {len(stream)} >>\nstream\n".encode() + stream + b"\nendstream"
        )
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets: dict[int, int] = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += f"{number} 0 obj\n".encode() + objects[number] + b"\nendobj\n"
    xref_at = len(out)
    count = max(objects) + 1
    out += f"xref\n0 {count}\n0000000000 65535 f \n".encode()
    for number in range(1, count):
        out += f"{offsets[number]:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {count} /Root 1 0 R >>\nstartxref\n{xref_at}\n%%EOF\n".encode()
    return bytes(out)


def main() -> None:
    target = Path(__file__).with_name("sample.pdf")
    target.write_bytes(build_pdf(PAGES))
    try:
        import pypdf
    except ImportError:
        print(f"wrote {target} (pypdf not installed: not checked)")
        return
    reader = pypdf.PdfReader(target)
    text = "\n".join(page.extract_text() for page in reader.pages)
    assert "three parts brown to one part green" in text, text
    print(f"wrote {target}: {len(reader.pages)} pages, text checked with pypdf")


if __name__ == "__main__":
    main()
