"""Read a JSON document from a stream, keeping only the tail of each long string.

Why: a SandboxFusion reply carries the code's whole stdout and stderr as JSON
strings (up to tens of MiB), and the client keeps only the last
``max_output_bytes`` of each. Reading the reply whole and decoding it costs
the trainer several times its size per call in flight, whatever is kept
(four calls printing 31 MiB added 217 MiB). Here the reply is read in pieces
of :data:`PIECE` bytes and nothing grows with the output's size:

* outside strings the bytes (the *envelope*: keys, numbers, short strings)
  are copied into a reduced document, at most ``envelope`` bytes of it;
* a string of at most :data:`SHORT` raw bytes is copied as it is;
* a longer one is decoded piece by piece (cut only between whole escapes,
  never inside a UTF-8 sequence or a surrogate pair), keeping its last
  ``keep`` characters and counting its UTF-8 size, and is replaced in the
  reduced document by a reference; :func:`read` then puts a :class:`Cut` (a
  ``str``: the tail, with the full ``size`` and ``length`` attached) there.

The reduced document is then decoded with :func:`json.loads`. Memory is
bounded by ``envelope`` + ``PIECE`` + ``keep`` x the number of long strings
(at most :data:`MAX_LONG`). Scanning uses regular expressions and
``json.loads`` on whole pieces, never a Python loop per character, so a reply
of a million escapes costs what a reply of a million letters does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

PIECE = 1 << 16  # bytes read and decoded at a time
SHORT = 4096  # longer strings (raw, escaped) are kept as a tail only
MAX_LONG = 16  # long strings per document (a SandboxFusion reply has stdout and stderr)
_REF_KEY = "\x00retool-cut"

# Escaped backslashes, paired from a string's start as JSON pairs them, become two
# bytes that a JSON document never holds raw (control characters); every backslash
# left then starts an escape, and escaped quotes become two such bytes too, so the
# first quote left ends the string. Same length, so offsets stay the same.
_PAIR, _PAIRED = b"\\\\", b"\x00\x01"
_QUOTE, _QUOTED = b'\\"', b"\x02\x03"


def _masked(data: bytes) -> bytes:
    if b"\\" not in data:  # a byte search is much faster than a replace that finds nothing
        return data
    return data.replace(_PAIR, _PAIRED).replace(_QUOTE, _QUOTED)


def _unmasked(data: bytes | bytearray) -> bytes:
    data = bytes(data)
    if _PAIRED[:1] in data:
        data = data.replace(_PAIRED, _PAIR)
    return data.replace(_QUOTED, _QUOTE) if _QUOTED[:1] in data else data


class Cut(str):
    """The tail of a long JSON string (its last characters), with the whole's size."""

    size: int  # UTF-8 bytes of the whole string (lone surrogates count 1, as "?")
    length: int  # characters of the whole string

    def __new__(cls, tail: str, size: int, length: int) -> Cut:
        value = super().__new__(cls, tail)
        value.size, value.length = size, length
        return value


class _LongString:
    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.tail = ""
        self.size = 0
        self.length = 0

    def add(self, raw: bytes) -> None:
        text = json.loads(b'"' + raw + b'"')
        self.size += len(text.encode("utf-8", errors="replace"))
        self.length += len(text)
        self.tail = (self.tail + text)[-self.keep :] if self.keep else ""


def _safe_cut(raw: bytes | bytearray) -> int:
    """The largest prefix of ``raw`` (string content, backslash pairs replaced) made
    of whole characters: not inside an escape, a surrogate pair or a UTF-8 sequence."""
    cut = len(raw)
    for _ in range(2):  # an incomplete escape, then a high surrogate before it
        escape = raw.rfind(b"\\", max(0, cut - 12), cut)
        if escape < 0:
            break
        unicode = raw[escape + 1 : escape + 2] == b"u"
        if escape + (6 if unicode else 2) > cut:
            cut = escape  # incomplete
        elif (
            unicode
            and escape + 6 == cut
            and re.fullmatch(rb"[dD][89abAB]", raw[escape + 2 : escape + 4])
        ):
            cut = escape  # a high surrogate: its low half may follow
            break
        else:
            break
    if raw[cut - 1 : cut] in (_PAIRED[:1], _QUOTED[:1]):
        return cut - 1  # between the two bytes of an escaped backslash or quote
    for back in range(1, min(4, cut) + 1):
        byte = raw[cut - back]
        if byte < 0x80:
            break
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return cut - back if back < need else cut
    return cut


def read(
    read_piece: Callable[[int], bytes], keep: int, envelope: int = 1 << 20, limit: int = 1 << 62
) -> Any:
    """The JSON document that ``read_piece(n)`` yields (b"" at its end), long strings cut.

    ``keep``: characters kept of each long string; ``envelope``: bytes of the
    reduced document; ``limit``: bytes read in all. Raises :class:`ValueError`
    for a malformed document, :class:`OverflowError` past ``envelope`` or
    ``limit``, :class:`MemoryError` never by design.
    """
    reduced = bytearray()
    longs: list[_LongString] = []
    raw = bytearray()  # the current string's content not yet taken
    long: _LongString | None = None
    in_string = False
    carry = b""
    total = 0
    while True:
        piece = read_piece(PIECE)
        total += len(piece)
        if total > limit:
            raise OverflowError(f"the document is over {limit} bytes")
        if not piece:
            if in_string or carry:
                raise ValueError("the document ends inside a string")
            break
        if any(byte in piece for byte in (b"\x00", b"\x01", b"\x02", b"\x03")):
            raise ValueError("a control character in the document")
        buf = carry + piece
        carry = b""
        at = 0
        while at < len(buf):
            if not in_string:
                quote = buf.find(b'"', at)
                end = len(buf) if quote < 0 else quote
                reduced += buf[at:end]
                if len(reduced) > envelope:
                    raise OverflowError(f"the document's envelope is over {envelope} bytes")
                if quote < 0:
                    break
                in_string, at = True, quote + 1
                continue
            quote = buf.find(b'"', at)
            if quote >= 0 and buf.find(b"\\", at, quote) < 0:  # no escapes: the common case
                end, closed = quote, True
                raw += buf[at:end]
            else:
                view = _masked(buf[at:])
                found = view.find(b'"')
                closed = found >= 0
                end = found if closed else len(view)
                if not closed and view.endswith(b"\\"):
                    end -= 1  # a lone backslash ends the piece: it pairs with the next byte
                    carry = bytes(buf[at + end :])
                raw += view[:end]
                end += at
            if long is None and len(raw) > SHORT:
                if len(longs) == MAX_LONG:
                    raise OverflowError(f"the document has over {MAX_LONG} long strings")
                long = _LongString(keep)
            if long is not None and (closed or len(raw) > PIECE):
                cut = len(raw) if closed else _safe_cut(raw)
                if not closed and cut == 0 and len(raw) > 32:  # no character takes 32 bytes
                    raise ValueError("a string with an invalid escape")
                long.add(_unmasked(raw[:cut]))
                del raw[:cut]
            if not closed:
                break
            if long is None:
                reduced += b'"' + _unmasked(raw) + b'"'
                if len(reduced) > envelope:
                    raise OverflowError(f"the document's envelope is over {envelope} bytes")
            else:
                reduced += b'{"\\u0000retool-cut": %d}' % len(longs)
                longs.append(long)
            raw.clear()
            long, in_string, at = None, False, end + 1
    document = json.loads(bytes(reduced))
    return _resolve(document, longs) if longs else document


def _resolve(value: Any, longs: list[_LongString]) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _REF_KEY in value and isinstance(value[_REF_KEY], int):
            found = longs[value[_REF_KEY]]
            return Cut(found.tail, found.size, found.length)
        return {key: _resolve(item, longs) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, longs) for item in value]
    return value
