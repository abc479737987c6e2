"""JSON as Go's ``encoding/json`` writes it (``json.Marshal``), for every nsqpy program.

Pure and dependency-free, so the wire codecs, the servers and the tools share it.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any, Final

__all__ = ["encode_json", "go_json_float"]

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_HTML_ESCAPES: Final = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_HTML_CHARS = re.compile("[<>&\u2028\u2029]")
_RAW_NUMBER = re.compile(r'"\\u0000(\d+)\\u0000"')


def go_json_float(value: float) -> str:
    """A float64 as ``encoding/json`` writes it: ``1`` not ``1.0``, ``1e-7`` not ``1e-07``."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"json: unsupported value: {value}")
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        # repr is in e-notation here, exponent of two digits at least; Go drops "e-0"'s zero.
        return repr(value).replace("e-0", "e-")
    if value == int(value):
        return str(int(value))
    return format(Decimal(repr(value)), "f")


def _go_numbers(o: Any, raw: list[str]) -> Any:
    """``o`` with floats made to print as Go prints them.

    Integral floats become ints (Go writes ``1``, not ``1.0``); the rare float whose
    Python repr differs from Go's (``1e-05`` vs ``0.00001``) becomes a placeholder
    string replaced after encoding.
    """
    if isinstance(o, float) and not isinstance(o, bool):
        if o == int(o) and abs(o) < 1e21:
            return int(o)
        text = go_json_float(o)
        if text == repr(o):
            return o
        raw.append(text)
        return f"\x00{len(raw) - 1}\x00"
    if isinstance(o, dict):
        return {k: _go_numbers(v, raw) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_go_numbers(v, raw) for v in o]
    return o


def encode_json(value: Any, *, sort_keys: bool = False) -> bytes:
    """``json.Marshal``'s bytes: compact, HTML characters escaped, Go's float format.

    Invalid UTF-8 (lone surrogates) becomes U+FFFD, as Go writes it. ``sort_keys``
    for values Go holds in maps (it sorts map keys; struct fields keep their order).
    """
    raw: list[str] = []
    text = json.dumps(
        _go_numbers(value, raw),
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
        sort_keys=sort_keys,
    )
    if raw:
        text = _RAW_NUMBER.sub(lambda m: raw[int(m.group(1))], text)
    if _LONE_SURROGATE.search(text):
        text = _LONE_SURROGATE.sub("\ufffd", text)
    if _HTML_CHARS.search(text):
        text = _HTML_CHARS.sub(lambda m: _HTML_ESCAPES[m.group(0)], text)
    return text.encode("utf-8")
