"""Snappy framing and raw DEFLATE stream codecs (nsqpy.wire.compression, spec §2.4).

The snappy side is checked against cramjam's framed codec (Rust's snap crate, an
independent implementation of the same framing format) and against frames built by
hand with the reference CRC-32C; the deflate side against plain zlib.
"""

from __future__ import annotations

import os
import struct
import zlib

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.wire.compression import (
    MAX_SNAPPY_BLOCK_SIZE,
    SNAPPY_STREAM_IDENTIFIER,
    CompressionError,
    DeflateStreamDecoder,
    DeflateStreamEncoder,
    SnappyStreamDecoder,
    SnappyStreamEncoder,
    crc32c,
    masked_crc32c,
)

TEXT = b"the quick brown fox jumps over the lazy dog " * 50


def chunk(chunk_type: int, payload: bytes) -> bytes:
    return bytes([chunk_type]) + len(payload).to_bytes(3, "little") + payload


def uncompressed_chunk(data: bytes, crc: int | None = None) -> bytes:
    checksum = masked_crc32c(data) if crc is None else crc
    return chunk(0x01, struct.pack("<I", checksum) + data)


def chunks_of(stream: bytes) -> list[tuple[int, bytes]]:
    out = []
    pos = 0
    while pos < len(stream):
        length = int.from_bytes(stream[pos + 1 : pos + 4], "little")
        out.append((stream[pos], stream[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    assert pos == len(stream)
    return out


def feed_in_pieces(decoder: SnappyStreamDecoder, stream: bytes, cuts: list[int]) -> bytes:
    out = []
    last = 0
    for cut in [*sorted(cuts), len(stream)]:
        out.append(decoder.decode(stream[last:cut]))
        last = cut
    return b"".join(out)


# -- CRC-32C ----------------------------------------------------------------------------------


def test_crc32c_known_values() -> None:
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"\x00" * 32) == 0x8A9136AA  # RFC 3720 B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(b"456789", crc32c(b"123")) == crc32c(b"123456789")


@pytest.mark.parametrize("data", [b"a", b"hello world", TEXT, os.urandom(1000)])
def test_masked_crc_is_what_cramjam_writes(data: bytes) -> None:
    framed = bytes(cramjam.snappy.compress(data))
    assert framed.startswith(SNAPPY_STREAM_IDENTIFIER)
    [(chunk_type, payload)] = chunks_of(framed[len(SNAPPY_STREAM_IDENTIFIER) :])
    assert chunk_type in (0x00, 0x01)
    assert struct.unpack("<I", payload[:4])[0] == masked_crc32c(data)


# -- snappy: encoder ------------------------------------------------------------------------


def test_encoder_sends_the_stream_identifier_once() -> None:
    encoder = SnappyStreamEncoder()
    first = encoder.encode(b"OK frame")
    second = encoder.encode(TEXT)
    assert first.startswith(SNAPPY_STREAM_IDENTIFIER)
    assert not second.startswith(SNAPPY_STREAM_IDENTIFIER)
    assert second[0] == 0x00  # TEXT compresses: a compressed chunk
    assert bytes(cramjam.snappy.decompress(first + second)) == b"OK frame" + TEXT


def test_encoder_splits_at_64k_and_stores_incompressible_data() -> None:
    data = os.urandom(3 * MAX_SNAPPY_BLOCK_SIZE + 123)
    stream = SnappyStreamEncoder().encode(data)
    found = chunks_of(stream[len(SNAPPY_STREAM_IDENTIFIER) :])
    assert [t for t, _ in found] == [0x01] * 4  # random bytes: stored uncompressed
    assert [len(p) - 4 for _, p in found] == [MAX_SNAPPY_BLOCK_SIZE] * 3 + [123]
    pos = 0
    for _, payload in found:
        block = payload[4:]
        assert struct.unpack("<I", payload[:4])[0] == masked_crc32c(block)
        assert block == data[pos : pos + len(block)]
        pos += len(block)
    assert SnappyStreamDecoder().decode(stream) == data


# -- snappy: decoder ------------------------------------------------------------------------


def test_decoder_reads_cramjam_streams() -> None:
    data = TEXT + os.urandom(70_000) + TEXT
    assert SnappyStreamDecoder().decode(bytes(cramjam.snappy.compress(data))) == data


def test_decoder_one_byte_at_a_time() -> None:
    stream = SnappyStreamEncoder().encode(TEXT) + uncompressed_chunk(b"tail")
    decoder = SnappyStreamDecoder()
    out = b"".join(decoder.decode(stream[i : i + 1]) for i in range(len(stream)))
    assert out == TEXT + b"tail"


def test_decoder_returns_each_chunk_when_it_completes() -> None:
    decoder = SnappyStreamDecoder()
    one = uncompressed_chunk(b"one")
    assert decoder.decode(SNAPPY_STREAM_IDENTIFIER + one[:-1]) == b""
    assert decoder.decode(one[-1:] + uncompressed_chunk(b"two")[:5]) == b"one"
    assert decoder.decode(uncompressed_chunk(b"two")[5:]) == b"two"


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=8),
)
def test_decoder_any_split_of_any_stream(parts: list[bytes], cuts: list[int]) -> None:
    encoder = SnappyStreamEncoder()
    stream = b"".join(encoder.encode(p) for p in parts)
    cuts = [c for c in cuts if c <= len(stream)]
    assert feed_in_pieces(SnappyStreamDecoder(), stream, cuts) == b"".join(parts)


def test_decoder_skips_padding_skippable_chunks_and_repeated_identifiers() -> None:
    stream = (
        SNAPPY_STREAM_IDENTIFIER
        + uncompressed_chunk(b"a")
        + chunk(0xFE, b"\x00" * 10)  # padding
        + chunk(0x80, b"skip me")  # reserved skippable
        + chunk(0xFD, b"")
        + SNAPPY_STREAM_IDENTIFIER  # pynsq starts a new stream for every write
        + uncompressed_chunk(b"b")
    )
    assert SnappyStreamDecoder().decode(stream) == b"ab"


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (uncompressed_chunk(b"no identifier first"), "snappy: corrupt input"),
        (chunk(0xFF, b"sNaPpX"), "snappy: corrupt input"),
        (chunk(0xFF, b"sNaPpYY"), "snappy: corrupt input"),
        (SNAPPY_STREAM_IDENTIFIER + chunk(0x02, b"x"), "snappy: unsupported input"),
        (SNAPPY_STREAM_IDENTIFIER + chunk(0x7F, b""), "snappy: unsupported input"),
        (SNAPPY_STREAM_IDENTIFIER + chunk(0x01, b"abc"), "snappy: corrupt input"),
        (SNAPPY_STREAM_IDENTIFIER + chunk(0x00, b""), "snappy: corrupt input"),
        (SNAPPY_STREAM_IDENTIFIER + b"\x80\xff\xff\xff", "snappy: unsupported input"),
        (
            SNAPPY_STREAM_IDENTIFIER + b"\x01" + (MAX_SNAPPY_BLOCK_SIZE + 5).to_bytes(3, "little"),
            "snappy: corrupt input",
        ),
    ],
)
def test_decoder_rejects_what_golang_snappy_rejects(stream: bytes, message: str) -> None:
    decoder = SnappyStreamDecoder()
    with pytest.raises(CompressionError, match=message):
        decoder.decode(stream)
    with pytest.raises(CompressionError):  # and stays failed
        decoder.decode(SNAPPY_STREAM_IDENTIFIER)


def test_decoder_checks_checksums() -> None:
    bad_uncompressed = SNAPPY_STREAM_IDENTIFIER + uncompressed_chunk(b"data", crc=12345)
    with pytest.raises(CompressionError, match="snappy: corrupt input"):
        SnappyStreamDecoder().decode(bad_uncompressed)
    framed = bytearray(SnappyStreamEncoder().encode(TEXT))
    framed[len(SNAPPY_STREAM_IDENTIFIER) + 4] ^= 0x01  # flip a bit of the CRC
    with pytest.raises(CompressionError, match="snappy: corrupt input"):
        SnappyStreamDecoder().decode(bytes(framed))


def test_decoder_rejects_a_corrupt_block() -> None:
    block = b"\x05\xff\xff\xff\xff\xff"  # claims 5 bytes, then garbage
    stream = SNAPPY_STREAM_IDENTIFIER + chunk(0x00, struct.pack("<I", 0) + block)
    with pytest.raises(CompressionError):
        SnappyStreamDecoder().decode(stream)


# -- deflate ---------------------------------------------------------------------------------


def test_deflate_flushes_every_write() -> None:
    encoder = DeflateStreamEncoder(6)
    decompressor = zlib.decompressobj(-15)
    for data in (b"OK", TEXT, os.urandom(5000), b"x"):
        out = encoder.encode(data)
        assert out.endswith(b"\x00\x00\xff\xff")  # sync flush: everything decodable now
        assert decompressor.decompress(out) == data


@pytest.mark.parametrize("level", [1, 6, 9])
def test_deflate_levels_round_trip(level: int) -> None:
    encoder = DeflateStreamEncoder(level)
    decoder = DeflateStreamDecoder()
    stream = b"".join(encoder.encode(TEXT[i : i + 333]) for i in range(0, len(TEXT), 333))
    assert b"".join(decoder.decode(stream[i : i + 7]) for i in range(0, len(stream), 7)) == TEXT
    assert encoder.level == level


def test_deflate_decoder_reads_plain_zlib_raw_streams() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = compressor.compress(TEXT) + compressor.flush(zlib.Z_SYNC_FLUSH)
    decoder = DeflateStreamDecoder()
    assert b"".join(decoder.decode(stream[i : i + 1]) for i in range(len(stream))) == TEXT


def test_deflate_decoder_errors() -> None:
    with pytest.raises(CompressionError, match="flate: corrupt input"):
        DeflateStreamDecoder().decode(b"\xff\xff\xff\xff")
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    finished = compressor.compress(b"bye") + compressor.flush()  # a final block
    decoder = DeflateStreamDecoder()
    assert decoder.decode(finished) == b"bye"
    with pytest.raises(CompressionError, match="stream ended"):
        decoder.decode(b"more")
