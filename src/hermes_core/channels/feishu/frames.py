"""The long-connection frame: proto2 `pbbp2.Frame`, encoded and decoded by hand.

    message Header { required string key = 1; required string value = 2; }
    message Frame  { required uint64 SeqID = 1; required uint64 LogID = 2; required int32 service = 3;
                     required int32 method = 4; repeated Header headers = 5;
                     optional string payload_encoding = 6; optional string payload_type = 7;
                     optional bytes payload = 8; optional string LogIDNew = 9; }

Two message types do not justify a protobuf runtime: this is the whole wire format (varints and
length-delimited fields), about the size of a .proto file plus its generated stub.
tests/test_feishu_reference.py checks it against the SDK's generated `pbbp2_pb2.Frame`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

METHOD_CONTROL = 0
METHOD_DATA = 1

_VARINT, _LENGTH = 0, 2


class FrameError(ValueError):
    """The bytes are not a valid Frame."""


@dataclass
class Frame:
    seq_id: int = 0
    log_id: int = 0
    service: int = 0
    method: int = METHOD_CONTROL
    headers: list[tuple[str, str]] = field(default_factory=list)
    payload_encoding: str | None = None
    payload_type: str | None = None
    payload: bytes | None = None
    log_id_new: str | None = None

    def header(self, key: str, default: str | None = None) -> str | None:
        for name, value in self.headers:
            if name == key:
                return value
        return default

    def with_header(self, key: str, value: str) -> Frame:
        """A copy with `key` set (replacing an existing value)."""
        headers = [(k, v) for k, v in self.headers if k != key] + [(key, value)]
        return Frame(
            self.seq_id, self.log_id, self.service, self.method, headers,
            self.payload_encoding, self.payload_type, self.payload, self.log_id_new,
        )  # fmt: skip

    def encode(self) -> bytes:
        out = bytearray()
        _field_varint(out, 1, self.seq_id)
        _field_varint(out, 2, self.log_id)
        _field_varint(out, 3, self.service & 0xFFFFFFFFFFFFFFFF)  # int32: negatives as 10-byte varints
        _field_varint(out, 4, self.method & 0xFFFFFFFFFFFFFFFF)
        for key, value in self.headers:
            header = bytearray()
            _field_bytes(header, 1, key.encode())
            _field_bytes(header, 2, value.encode())
            _field_bytes(out, 5, bytes(header))
        for number, text in ((6, self.payload_encoding), (7, self.payload_type)):
            if text is not None:
                _field_bytes(out, number, text.encode())
        if self.payload is not None:
            _field_bytes(out, 8, self.payload)
        if self.log_id_new is not None:
            _field_bytes(out, 9, self.log_id_new.encode())
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> Frame:
        frame, seen = cls(), set()
        for number, value in _fields(data):
            seen.add(number)
            if number == 1:
                frame.seq_id = _as_int(value)
            elif number == 2:
                frame.log_id = _as_int(value)
            elif number == 3:
                frame.service = _int32(_as_int(value))
            elif number == 4:
                frame.method = _int32(_as_int(value))
            elif number == 5:
                header = dict(_fields(_as_bytes(value)))
                if 1 not in header or 2 not in header:
                    raise FrameError("header without key or value")
                frame.headers.append((_text(header[1]), _text(header[2])))
            elif number == 6:
                frame.payload_encoding = _text(value)
            elif number == 7:
                frame.payload_type = _text(value)
            elif number == 8:
                frame.payload = _as_bytes(value)
            elif number == 9:
                frame.log_id_new = _text(value)
        missing = {1, 2, 3, 4} - seen
        if missing:
            raise FrameError(f"required fields missing: {sorted(missing)}")
        return frame


def _field_varint(out: bytearray, number: int, value: int) -> None:
    _varint(out, number << 3 | _VARINT)
    _varint(out, value)


def _field_bytes(out: bytearray, number: int, value: bytes) -> None:
    _varint(out, number << 3 | _LENGTH)
    _varint(out, len(value))
    out += value


def _varint(out: bytearray, value: int) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise FrameError("truncated or oversized varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    fields: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, pos = _read_varint(data, pos)
            fields.append((number, value))
        elif wire_type == _LENGTH:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise FrameError("truncated field")
            fields.append((number, bytes(data[pos : pos + length])))
            pos += length
        elif wire_type == 5:  # fixed32: not in this schema, skipped like any unknown field
            pos += 4
        elif wire_type == 1:  # fixed64
            pos += 8
        else:
            raise FrameError(f"unsupported wire type {wire_type}")
    if pos != len(data):
        raise FrameError("truncated fixed-width field")
    return fields


def _as_int(value: int | bytes) -> int:
    if not isinstance(value, int):
        raise FrameError("expected a varint")
    return value


def _as_bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise FrameError("expected a length-delimited field")
    return value


def _text(value: int | bytes) -> str:
    try:
        return _as_bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError("string field is not UTF-8") from exc


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value
