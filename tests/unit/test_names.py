"""Topic and channel names (spec §2.6) and Go's %q (nsqpy.wire.names)."""

from __future__ import annotations

import pytest

from nsqpy.wire.names import (
    EPHEMERAL_SUFFIX,
    MAX_NAME_LENGTH,
    go_quote,
    is_ephemeral,
    is_valid_channel_name,
    is_valid_name,
    is_valid_topic_name,
)

VALID = [
    "a",
    "orders",
    "Orders.v2",
    "a_b-c.d",
    "...",
    "-",
    "_",
    "0123456789",
    "a" * 64,
    "a#ephemeral",
    "x" * 54 + "#ephemeral",  # 64 with the suffix
    "A.b_C-d#ephemeral",
]

INVALID = [
    "",
    "a" * 65,
    "x" * 55 + "#ephemeral",  # 65 with the suffix
    "#ephemeral",  # needs at least one character before the suffix
    "a#ephemeralb",
    "a#ephemeral#ephemeral",
    "a#Ephemeral",
    "a#ephemera",
    "a#",
    "#",
    "a b",
    "a:b",
    "a/b",
    "a\\b",
    "a*",
    "a@b",
    "a,b",
    "é",
    "ab\u0661",  # a non-ASCII digit
    "\x00",
    "a\tb",
    "a\r",
    " a",
    "a ",
]

# Go's regexp `$` matches only at the very end of the text (no multi-line mode), unlike
# Python's `$`, which also matches before a final "\n".
TRAILING_NEWLINE = ["abc\n", "a#ephemeral\n", "\n"]


@pytest.mark.parametrize("name", VALID)
def test_valid_names(name: str) -> None:
    assert is_valid_name(name)
    assert is_valid_topic_name(name)
    assert is_valid_channel_name(name)


@pytest.mark.parametrize("name", INVALID)
def test_invalid_names(name: str) -> None:
    assert not is_valid_name(name)
    assert not is_valid_topic_name(name)
    assert not is_valid_channel_name(name)


@pytest.mark.parametrize("name", TRAILING_NEWLINE)
def test_trailing_newline_is_invalid(name: str) -> None:
    assert not is_valid_topic_name(name)
    assert not is_valid_channel_name(name)


def test_length_limit_boundaries() -> None:
    assert MAX_NAME_LENGTH == 64
    assert EPHEMERAL_SUFFIX == "#ephemeral"
    for n in range(1, 70):
        assert is_valid_name("t" * n) is (n <= 64)
        if n > len(EPHEMERAL_SUFFIX):
            eph = "t" * (n - len(EPHEMERAL_SUFFIX)) + EPHEMERAL_SUFFIX
            assert len(eph) == n
            assert is_valid_name(eph) is (n <= 64)


@pytest.mark.parametrize("ch", [chr(c) for c in range(128)])
def test_each_ascii_character(ch: str) -> None:
    allowed = ch.isascii() and (ch.isalnum() or ch in "._-")
    assert is_valid_name(ch * 3) is allowed


def test_is_ephemeral() -> None:
    assert is_ephemeral("t#ephemeral")
    assert is_ephemeral("x" * 54 + "#ephemeral")
    assert not is_ephemeral("t")
    assert not is_ephemeral("t#ephemeralx")
    assert not is_ephemeral("ephemeral")


# Expected outputs are Go's fmt.Sprintf("%q", s) (strconv.Quote).
GO_QUOTE = [
    (b"", '""'),
    (b"orders", '"orders"'),
    (b"a b", '"a b"'),
    (b"'", '"\'"'),
    (b'"', '"\\""'),
    (b'a"b"', '"a\\"b\\""'),
    (b"\\", '"\\\\"'),
    (b"a\\b", '"a\\\\b"'),
    (b"\a\b\f\n\r\t\v", '"\\a\\b\\f\\n\\r\\t\\v"'),
    (b"\x00", '"\\x00"'),
    (b"\x01\x1b\x1f", '"\\x01\\x1b\\x1f"'),
    (b"\x7f", '"\\x7f"'),
    (b"\xff", '"\\xff"'),
    (b"a\xfeb", '"a\\xfeb"'),
    (b"\x80", '"\\x80"'),
    (b"\xc3", '"\\xc3"'),  # truncated 2-byte sequence
    (b"\xc3\xa9", '"é"'),  # valid UTF-8 stays as is
    (b"\xe2\x82", '"\\xe2\\x82"'),  # truncated 3-byte sequence at the end
    (b"\xe2\x82a", '"\\xe2\\x82a"'),
    (b"\xc0\xaf", '"\\xc0\\xaf"'),  # overlong encoding
    (b"\xed\xa0\x80", '"\\xed\\xa0\\x80"'),  # UTF-16 surrogate: invalid UTF-8
    (b"\xf4\x90\x80\x80", '"\\xf4\\x90\\x80\\x80"'),  # beyond U+10FFFF
    ("\u00a0".encode(), '"\\u00a0"'),  # no-break space: not printable for Go
    ("\u0085".encode(), '"\\u0085"'),  # C1 control
    ("\u00ad".encode(), '"\\u00ad"'),  # soft hyphen (Cf)
    ("\u200b".encode(), '"\\u200b"'),
    ("\u2028".encode(), '"\\u2028"'),
    ("\u3000".encode(), '"\\u3000"'),
    ("\ufeff".encode(), '"\\ufeff"'),
    ("\ue000".encode(), '"\\ue000"'),  # private use
    ("\ufffd".encode(), '"\ufffd"'),  # a valid U+FFFD is printable
    ("\U0010ffff".encode(), '"\\U0010ffff"'),
    ("\U000e0001".encode(), '"\\U000e0001"'),  # language tag (Cf)
    ("日本語".encode(), '"日本語"'),
    ("😀".encode(), '"😀"'),
    ("e\u0301".encode(), '"e\u0301"'),  # combining mark is printable
    (b"t#ephemeral", '"t#ephemeral"'),
]


@pytest.mark.parametrize(("raw", "quoted"), GO_QUOTE)
def test_go_quote_bytes(raw: bytes, quoted: str) -> None:
    assert go_quote(raw) == quoted


@pytest.mark.parametrize(("raw", "quoted"), GO_QUOTE)
def test_go_quote_str_via_surrogateescape(raw: bytes, quoted: str) -> None:
    # the protocol layer keeps wire bytes as surrogate-escaped text
    assert go_quote(raw.decode("utf-8", "surrogateescape")) == quoted


def test_go_quote_output_is_ascii_safe_for_invalid_bytes() -> None:
    for b in range(0x80, 0x100):
        out = go_quote(bytes([b]))
        assert out == f'"\\x{b:02x}"'
        out.encode("utf-8")  # no surrogates left over
