"""Topic and channel name rules (spec §2.6), shared by nsqd, nsqlookupd and the clients."""

from __future__ import annotations

import re

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64

# fullmatch, not `$`: Python's `$` also matches before a final "\n", Go's does not.
_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """True if ``name`` is a valid topic or channel name (NSQ's ``protocol.isValidName``)."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _NAME_RE.fullmatch(name) is not None


# Topics and channels follow the same rule; the two names keep call sites reading like NSQ's.
is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    """True for ``#ephemeral`` topics and channels: memory only, deleted when unused."""
    return name.endswith(EPHEMERAL_SUFFIX)


def go_quote(value: bytes | str) -> str:
    """Render like Go's ``%q`` verb, which NSQ uses for names in error strings."""
    text = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xDC80 <= code <= 0xDCFF:  # an invalid UTF-8 byte, kept by surrogateescape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif not ch.isprintable():
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}
