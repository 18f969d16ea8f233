"""Documents the tests send or serve, written by hand so no library is needed to make them."""

from __future__ import annotations


def pdf(text: str) -> bytes:
    """A one-page PDF showing `text` in Helvetica, written object by object with its xref table."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> "
        b"/Contents 4 0 R >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def hostile_pdf(pages: int = 16, operators: int = 100_000) -> bytes:
    """A small PDF whose text extraction takes pypdf seconds per page: every page shares one
    Flate-compressed content stream of `operators` text-showing operators (`1 0 Td (a) Tj`), a few
    KB on disk. The shape is the decompression-amplification case of the PDF specification
    (ISO 32000-1 §7.3.8: a stream's filters; §7.8.2: content streams may be shared by pages):
    100,000 operators stay under pypdf's own limit of tokens per stream, so each page is read in
    full, and each page pays again. Built with pypdf itself (the `pdf` extra)."""
    import io

    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    font = DictionaryObject(
        {NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
         NameObject("/BaseFont"): NameObject("/Helvetica")}
    )  # fmt: skip
    resources = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})}
    )
    stream = DecodedStreamObject()
    stream.set_data(b"BT /F1 1 Tf " + b"1 0 Td (a) Tj " * operators + b"ET")
    shared = writer._add_object(stream.flate_encode(level=9))
    for _ in range(pages):
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = resources
        page[NameObject("/Contents")] = shared
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
