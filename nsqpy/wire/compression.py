"""Stream compression negotiated by IDENTIFY (spec §2.4): snappy framing and raw DEFLATE.

Pure codecs, no I/O: an encoder turns what one flush writes into the bytes to send, a
decoder turns whatever arrived into the bytes it completes. nsqd wraps a connection in
one of them after its IDENTIFY reply; clients (and the tests) use the same classes.

Snappy
    Go's nsqd uses github.com/golang/snappy's *framing format* (Reader/Writer), not raw
    snappy blocks: a stream identifier chunk ``ff 06 00 00 "sNaPpY"`` once at the start,
    then chunks ``[type][24-bit little-endian length][masked CRC-32C of the uncompressed
    data][data]`` with at most 64 KiB of uncompressed data each; type 0x00 holds a snappy
    block, 0x01 the data as is. Blocks are compressed and checked by cramjam (Rust's snap
    crate, whose ``compress``/``decompress`` speak this same framing format and verify the
    checksums); this module only splits the stream into chunks and applies Go's limits
    and error strings. :func:`crc32c` is a plain table-driven reference implementation,
    for building and checking frames by hand.

DEFLATE
    RFC 1951 raw deflate (no zlib header: ``wbits=-15``), as Go's compress/flate. Each
    flush ends with a sync flush (an empty stored block, ``00 00 ff ff``), as Go's
    ``flate.Writer.Flush`` does, so the peer can decode everything sent so far.
"""

from __future__ import annotations

import zlib
from typing import Any, Final

__all__ = [
    "MAX_SNAPPY_BLOCK_SIZE",
    "SNAPPY_STREAM_IDENTIFIER",
    "CompressionError",
    "DeflateStreamDecoder",
    "DeflateStreamEncoder",
    "SnappyStreamDecoder",
    "SnappyStreamEncoder",
    "crc32c",
    "masked_crc32c",
]

SNAPPY_STREAM_IDENTIFIER: Final = b"\xff\x06\x00\x00sNaPpY"
MAX_SNAPPY_BLOCK_SIZE: Final = 65536  # uncompressed bytes per chunk
# golang/snappy's Reader refuses any chunk longer than its buffer: MaxEncodedLen(64 KiB) + CRC.
_MAX_CHUNK_LENGTH: Final = 32 + MAX_SNAPPY_BLOCK_SIZE + MAX_SNAPPY_BLOCK_SIZE // 6 + 4

_CHUNK_COMPRESSED: Final = 0x00
_CHUNK_UNCOMPRESSED: Final = 0x01
_CHUNK_STREAM_IDENTIFIER: Final = 0xFF

# golang/snappy's error strings (ErrCorrupt, ErrUnsupported).
SNAPPY_CORRUPT: Final = "snappy: corrupt input"
SNAPPY_UNSUPPORTED: Final = "snappy: unsupported input"


class CompressionError(Exception):
    """The peer sent a stream that does not decode; the connection cannot go on."""


# -- CRC-32C (Castagnoli), as the snappy framing format uses it --------------------------


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE: Final = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C of ``data`` (continuing from ``crc``), byte at a time from a table."""
    table = _CRC32C_TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The checksum a snappy chunk carries: CRC-32C rotated right by 15, plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -- snappy framing ----------------------------------------------------------------------


def _cramjam() -> Any:
    # imported by the first snappy stream: most nsqds never negotiate one
    import cramjam

    return cramjam


class SnappyStreamEncoder:
    """golang/snappy's ``Writer``: the stream identifier first, then one or more chunks
    (64 KiB of input each, stored uncompressed when compression does not pay) per call."""

    __slots__ = ("_snappy", "_started")

    def __init__(self) -> None:
        self._snappy = _cramjam().snappy
        self._started = False

    def encode(self, data: bytes) -> bytes:
        """The framed bytes for ``data`` (which must not be empty)."""
        framed = self._snappy.compress(data)
        if self._started:
            # cramjam starts every stream with the identifier; ours has already sent it.
            return bytes(memoryview(framed)[len(SNAPPY_STREAM_IDENTIFIER) :])
        self._started = True
        return bytes(framed)


class SnappyStreamDecoder:
    """golang/snappy's ``Reader``, fed incrementally.

    Complete chunks are checked against Go's rules here (the stream identifier first,
    chunk lengths, reserved chunk types) and decoded, checksums verified, in one cramjam
    call per :meth:`decode`; a partial chunk waits for the next call.
    """

    __slots__ = ("_buf", "_cramjam", "_failed", "_started")

    def __init__(self) -> None:
        self._cramjam = _cramjam()
        self._buf = b""
        self._started = False
        self._failed: str | None = None

    def decode(self, data: bytes) -> bytes:
        """The uncompressed bytes completed by ``data``; raises :class:`CompressionError`."""
        if self._failed is not None:
            raise CompressionError(self._failed)
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        try:
            while n - pos >= 4:
                chunk_type = buf[pos]
                length = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
                if not self._started:
                    if chunk_type != _CHUNK_STREAM_IDENTIFIER:
                        raise CompressionError(SNAPPY_CORRUPT)
                    self._started = True
                if length > _MAX_CHUNK_LENGTH:
                    raise CompressionError(SNAPPY_UNSUPPORTED)
                if chunk_type <= _CHUNK_UNCOMPRESSED:
                    if length < 4:
                        raise CompressionError(SNAPPY_CORRUPT)
                    if chunk_type == _CHUNK_UNCOMPRESSED and length - 4 > MAX_SNAPPY_BLOCK_SIZE:
                        raise CompressionError(SNAPPY_CORRUPT)
                elif chunk_type == _CHUNK_STREAM_IDENTIFIER:
                    if length != 6:
                        raise CompressionError(SNAPPY_CORRUPT)
                elif chunk_type <= 0x7F:
                    raise CompressionError(SNAPPY_UNSUPPORTED)  # reserved unskippable
                if n - pos - 4 < length:
                    break
                if chunk_type == _CHUNK_STREAM_IDENTIFIER and buf[pos + 4 : pos + 10] != b"sNaPpY":
                    raise CompressionError(SNAPPY_CORRUPT)
                pos += 4 + length
            self._buf = buf[pos:]
            if pos == 0:
                return b""
            # Every complete chunk so far, behind an identifier so that cramjam accepts it.
            return bytes(self._cramjam.snappy.decompress(SNAPPY_STREAM_IDENTIFIER + buf[:pos]))
        except CompressionError as err:
            self._failed = str(err)
            raise
        except self._cramjam.DecompressionError as err:
            self._failed = SNAPPY_CORRUPT
            raise CompressionError(f"{SNAPPY_CORRUPT} ({err})") from None


# -- raw DEFLATE -----------------------------------------------------------------------


class DeflateStreamEncoder:
    """Go's ``flate.Writer`` at ``level``, flushed (sync flush) after every call."""

    __slots__ = ("_compressor", "level")

    def __init__(self, level: int = 6) -> None:
        self.level = level
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -15)

    def encode(self, data: bytes) -> bytes:
        """The deflated bytes for ``data``, ending at a byte boundary the peer can decode."""
        compressor = self._compressor
        return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


class DeflateStreamDecoder:
    """Go's ``flate.NewReader``, fed incrementally."""

    __slots__ = ("_decompressor",)

    def __init__(self) -> None:
        self._decompressor = zlib.decompressobj(-15)

    def decode(self, data: bytes) -> bytes:
        """The inflated bytes ``data`` completes; raises :class:`CompressionError`."""
        decompressor = self._decompressor
        if decompressor.eof:
            # The peer ended its deflate stream (a final block): Go's reader returns EOF.
            raise CompressionError("flate: stream ended")
        try:
            return decompressor.decompress(data)
        except zlib.error as err:
            raise CompressionError(f"flate: corrupt input ({err})") from None
