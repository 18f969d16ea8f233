"""The text of a Word, Excel or PowerPoint file (docx, xlsx, pptx) a user sent, for the model to read
(gateway/media.py saves it beside the file, like a PDF's text).

Read with the libraries of the `office` extra, each the well-kept reader of its format:
python-docx (paragraphs and tables), openpyxl (every sheet's cell values, read-only, the values
last computed rather than formulas) and python-pptx (each slide's text frames and tables).

An Office file is a ZIP archive, so its size says little about what it unpacks to. Before a
library opens it, the archive's directory is checked: at most `MAX_PARTS` members and
`MAX_UNPACKED` bytes unpacked in all (Python's zipfile stops each member at its declared size and
fails its CRC beyond it, so the declared sizes bound the work whatever the archive claims). The
text is cut at `MAX_CHARS`. The type itself (`PK\\x03\\x04` and the expected main part) was checked
before the file was saved (channels/media.py `file_type`).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator

from ..channels.media import DOCX, PPTX, XLSX, sniff_office

MAX_UNPACKED = 100 * 1024 * 1024  # bytes all members unpack to
MAX_PARTS = 5_000
MAX_CHARS = 1_000_000
MAX_ROWS = 100_000  # rows of all sheets together


def office_text(data: bytes) -> str:
    """The text of a docx, xlsx or pptx document; `ValueError` when its archive is over the bounds,
    `ImportError` without the `office` extra, the library's own error when it is broken."""
    check_archive(data)
    kind = sniff_office(data)
    readers = {DOCX: _docx_lines, XLSX: _xlsx_lines, PPTX: _pptx_lines}
    if kind not in readers:
        raise ValueError("not a Word, Excel or PowerPoint document")
    parts: list[str] = []
    size = 0
    for line in readers[kind](data):
        parts.append(line)
        size += len(line) + 1
        if size > MAX_CHARS:
            break
    return "\n".join(parts)[:MAX_CHARS]


def check_archive(data: bytes) -> None:
    """`ValueError` when the ZIP archive unpacks to too much (a zip bomb) or has too many members."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
        if len(members) > MAX_PARTS:
            raise ValueError(f"the archive has more than {MAX_PARTS} members")
        if sum(member.file_size for member in members) > MAX_UNPACKED:
            raise ValueError("the archive unpacks to more than the limit")


def _docx_lines(data: bytes) -> Iterator[str]:
    from docx import Document

    document = Document(io.BytesIO(data))
    for paragraph in document.paragraphs:
        yield paragraph.text
    for number, table in enumerate(document.tables, 1):
        yield f"\n[table {number}]"
        for row in table.rows:
            yield " | ".join(cell.text.strip() for cell in row.cells)


def _xlsx_lines(data: bytes) -> Iterator[str]:
    from openpyxl import load_workbook

    workbook = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    rows = 0
    try:
        for sheet in workbook.worksheets:
            yield f"[sheet {sheet.title}]"
            for row in sheet.iter_rows(values_only=True):
                rows += 1
                if rows > MAX_ROWS:
                    yield "… (more rows not read)"
                    return
                if any(value is not None for value in row):
                    yield "\t".join("" if value is None else str(value) for value in row)
    finally:
        workbook.close()


def _pptx_lines(data: bytes) -> Iterator[str]:
    from pptx import Presentation

    presentation = Presentation(io.BytesIO(data))
    for number, slide in enumerate(presentation.slides, 1):
        yield f"[slide {number}]"
        for shape in slide.shapes:
            if shape.has_text_frame:
                yield shape.text_frame.text
            if getattr(shape, "has_table", False):
                for row in shape.table.rows:
                    yield " | ".join(cell.text for cell in row.cells)


__all__ = ["check_archive", "office_text"]
