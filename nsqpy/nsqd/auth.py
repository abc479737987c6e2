"""nsqd's auth server client (spec §7.11), Go's ``internal/auth`` package.

With ``--auth-http-address`` set, a client must ``AUTH <secret>`` before SUB, PUB, MPUB
or DPUB. nsqd asks an auth server what the secret allows::

    GET http://<addr>/auth?common_name=<cn>&remote_ip=<ip>&secret=<secret>&tls=<bool>
    Accept: application/vnd.nsq; version=1.0

(``--auth-http-request-method=post``: the same endpoint, the same values as a JSON map
of lists in the body.) The answer, cached for its ``ttl`` seconds, lists
authorizations: a topic regex, channel regexes and permissions (``subscribe``,
``publish``). A command is allowed when one authorization has its permission, its topic
regex matches the topic and one of its channel regexes matches the channel (the empty
string for publishing). Regexes match anywhere in the name (unanchored), as Go's
``MatchString``.

Go regexp (RE2) versus Python ``re``: :func:`compile_go_regexp` translates what differs
in meaning (``\\z``, ``\\Q...\\E``, ``[[:alpha:]]``, ``(?<name>...)``, ``\\pL``,
``\\123`` octal, ``$`` at the very end only) and refuses what RE2 refuses
but ``re`` would accept (look-arounds, back-references, atomic groups, possessive
repeats, conditionals, ``(?#...)``, flags other than ``imsU``), so that an answer Go
rejects is rejected here too (``E_AUTH_FAILED``). Left as they are: ``(?U)`` (refused,
with the Unicode classes other than letters and digits, which ``re`` cannot express),
and ``\\s``, ``\\d``, ``\\w`` being ASCII (``re.ASCII``), which is what RE2 does; topic
and channel names are ASCII, so the rest of Unicode never matters for matching.
"""

from __future__ import annotations

import json
import random
import re
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from nsqpy.common.gojson import encode_json

__all__ = [
    "ACCEPT_V1",
    "AuthClient",
    "AuthError",
    "AuthState",
    "Authorization",
    "auth_reply",
    "auth_values",
    "compile_go_regexp",
    "encode_values",
    "go_json",
    "parse_auth_response",
]

ACCEPT_V1: Final = "application/vnd.nsq; version=1.0"
PERMISSIONS: Final = ("subscribe", "publish")


class AuthError(Exception):
    """The auth server could not be asked, or its answer is not usable (never shown to
    the client, which only gets ``E_AUTH_FAILED AUTH failed``)."""


# -- Go regexp -----------------------------------------------------------------------------

_POSIX_CLASSES: Final = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
# \pX classes re can express (names are ASCII, and the pattern compiles with re.ASCII).
_UNICODE_CLASSES: Final = {"L": "A-Za-z", "N": "0-9", "Nd": "0-9", "Lu": "A-Z", "Ll": "a-z"}
_GROUP_FLAGS: Final = frozenset("imsU-")


def compile_go_regexp(pattern: str) -> re.Pattern[str]:
    """Compile a Go (RE2) regexp as an equivalent ``re`` pattern; raises ``ValueError``
    with the reason when Go's ``regexp.Compile`` would fail (or ``re`` cannot follow)."""
    out: list[str] = []
    i = 0
    n = len(pattern)
    in_class = False
    class_start = 0
    multiline = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise ValueError("trailing backslash at end of expression")
            d = pattern[i + 1]
            if d == "Q":
                end = pattern.find("\\E", i + 2)
                literal = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
                out.append(re.escape(literal))
                i = n if end < 0 else end + 2
                continue
            if d in "pP":
                i = _unicode_class(pattern, i, d == "P", in_class, out)
                continue
            if d in "01234567":
                # RE2 has no back-references: a lone \1..\7 is an error, \0 and \12 are
                # octal codes (up to three digits).
                j = i + 2
                if d != "0" and (j >= n or pattern[j] not in "01234567"):
                    raise ValueError(f"invalid escape sequence: `\\{d}`")
                while j < n and j < i + 4 and pattern[j] in "01234567":
                    j += 1
                out.append(re.escape(chr(int(pattern[i + 1 : j], 8))))
                i = j
                continue
            if d == "x" and pattern.startswith("{", i + 2):
                end = pattern.find("}", i + 3)
                try:
                    code = int(pattern[i + 3 : end], 16) if end > 0 else -1
                except ValueError:
                    code = -1
                if not 0 <= code <= 0x10FFFF:
                    raise ValueError("invalid escape sequence: `\\x{`")
                out.append(re.escape(chr(code)))
                i = end + 1
                continue
            if d == "z" and not in_class:
                out.append("\\Z")
            elif d in "AabBdDsSwWfnrtvx" or not d.isalnum():
                out.append(c + d)
            else:
                raise ValueError(f"invalid escape sequence: `\\{d}`")
            i += 2
            continue
        if in_class:
            if c == "[" and pattern.startswith("[:", i):
                end = pattern.find(":]", i + 2)
                name = pattern[i + 2 : end] if end >= 0 else ""
                if name in _POSIX_CLASSES:
                    out.append(_POSIX_CLASSES[name])
                    i = end + 2
                    continue
                if name.startswith("^") and name[1:] in _POSIX_CLASSES:
                    raise ValueError(f"negated POSIX class `[:{name}:]` is not supported")
                out.append("\\[")
            elif c == "]" and i > class_start:
                in_class = False
                out.append(c)
            elif c == "[":
                out.append("\\[")
            else:
                out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            class_start = i  # a "]" right here is a literal, in both syntaxes
            if i < n and pattern[i] == "]":
                out.append("\\]")
                i += 1
            continue
        if c == "(" and pattern.startswith("(?", i):
            i, multiline = _group_start(pattern, i, out, multiline)
            continue
        if c in "*+?" and i + 1 < n and pattern[i + 1] == "+":
            raise ValueError(f"invalid nested repetition operator: `{c}+`")
        if c == "}" and i + 1 < n and pattern[i + 1] == "+":
            raise ValueError("invalid nested repetition operator: `}+`")
        if c == "$" and not multiline:
            out.append("\\Z")  # RE2's $ is the end of the text; re's also matches before "\n"
        else:
            out.append(c)
        i += 1
    if in_class:
        raise ValueError(f"missing closing ]: `{pattern[class_start - 1 :]}`")
    try:
        return re.compile("".join(out), re.ASCII)
    except re.error as err:
        raise ValueError(str(err)) from None


def _group_start(pattern: str, i: int, out: list[str], multiline: bool) -> tuple[int, bool]:
    rest = pattern[i + 2 :]
    if rest.startswith("P<") or rest.startswith("<"):
        if rest.startswith("<=") or rest.startswith("<!"):
            raise ValueError(f"invalid or unsupported Perl syntax: `(?{rest[:2]}`")
        out.append("(?P<")
        return i + (4 if rest.startswith("P<") else 3), multiline
    j = 0
    while j < len(rest) and rest[j] in _GROUP_FLAGS:
        j += 1
    flags = rest[:j]
    if j == len(rest) or rest[j] not in ":)" or (not flags and rest[j] == ")"):
        raise ValueError(f"invalid or unsupported Perl syntax: `(?{rest[: j + 1]}`")
    if "U" in flags:
        raise ValueError("the (?U) flag is not supported")
    on = flags.split("-", 1)[0]
    if "m" in on and rest[j] == ")":
        multiline = True
    out.append("(?" + flags + rest[j])
    return i + 2 + j + 1, multiline


def _unicode_class(pattern: str, i: int, negated: bool, in_class: bool, out: list[str]) -> int:
    if i + 2 >= len(pattern):
        raise ValueError("invalid character class range")
    if pattern[i + 2] == "{":
        end = pattern.find("}", i + 3)
        if end < 0:
            raise ValueError("invalid character class range")
        name, after = pattern[i + 3 : end], end + 1
    else:
        name, after = pattern[i + 2], i + 3
    if name.startswith("^"):
        name, negated = name[1:], not negated
    ranges = _UNICODE_CLASSES.get(name)
    if ranges is None:
        raise ValueError(f"unicode class \\p{{{name}}} is not supported")
    if in_class:
        if negated:
            raise ValueError(f"negated unicode class \\P{{{name}}} in a class is not supported")
        out.append(ranges)
    else:
        out.append(f"[{'^' if negated else ''}{ranges}]")
    return after


# -- what the auth server answers ---------------------------------------------------------


@dataclass(frozen=True)
class Authorization:
    """One entry of ``authorizations``: permissions on topics and channels by regex."""

    topic: str
    channels: tuple[str, ...] = ()
    permissions: tuple[str, ...] = ()
    _topic_re: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _channel_res: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for permission in self.permissions:
            if permission not in PERMISSIONS:
                raise AuthError(f"unknown permission {permission}")
        try:
            topic_re = compile_go_regexp(self.topic)
        except ValueError as err:
            raise AuthError(f"unable to compile topic {json.dumps(self.topic)} {err}") from None
        channel_res = []
        for channel in self.channels:
            try:
                channel_res.append(compile_go_regexp(channel))
            except ValueError as err:
                raise AuthError(f"unable to compile channel {json.dumps(channel)} {err}") from None
        object.__setattr__(self, "_topic_re", topic_re)
        object.__setattr__(self, "_channel_res", tuple(channel_res))

    def has_permission(self, permission: str) -> bool:
        return permission in self.permissions

    def is_allowed(self, topic: str, channel: str) -> bool:
        """Go's ``Authorization.IsAllowed``: ``channel == ""`` asks to publish."""
        if not self.has_permission("subscribe" if channel else "publish"):
            return False
        if self._topic_re.search(topic) is None:
            return False
        return any(r.search(channel) is not None for r in self._channel_res)


@dataclass(frozen=True)
class AuthState:
    """An auth server's answer for one client, valid until ``expires`` (monotonic)."""

    ttl: int
    identity: str = ""
    identity_url: str = ""
    authorizations: tuple[Authorization, ...] = ()
    expires: float = 0.0

    def is_allowed(self, topic: str, channel: str) -> bool:
        return any(a.is_allowed(topic, channel) for a in self.authorizations)

    def is_expired(self, now: float | None = None) -> bool:
        return self.expires < (time.monotonic() if now is None else now)


def parse_auth_response(body: bytes, now: float | None = None) -> AuthState:
    """Read an auth server's 200 answer like Go's ``json.Unmarshal`` into ``auth.State``
    followed by ``QueryAuthd``'s checks; raises :class:`AuthError`."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise AuthError(f"invalid JSON response - {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AuthError(
            f"json: cannot unmarshal {_json_kind(data)} into Go value of type auth.State"
        )
    fields = _go_keys(data)
    ttl = fields.get("ttl")
    if ttl is None:
        ttl = 0
    elif isinstance(ttl, bool) or not isinstance(ttl, int) or not -(1 << 63) <= ttl < 1 << 63:
        raise AuthError(
            f"json: cannot unmarshal {_json_kind(ttl)} into Go struct field State.ttl of type int"
        )
    authorizations = []
    for item in _go_list(fields.get("authorizations"), "authorizations", (dict,)):
        entry = _go_keys(item or {})
        authorizations.append(
            Authorization(
                topic=_go_str(entry.get("topic"), "topic"),
                channels=tuple(
                    _go_str(c, "channels")
                    for c in _go_list(entry.get("channels"), "channels", (str,))
                ),
                permissions=tuple(
                    _go_str(p, "permissions")
                    for p in _go_list(entry.get("permissions"), "permissions", (str,))
                ),
            )
        )
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(
        ttl=ttl,
        identity=_go_str(fields.get("identity"), "identity"),
        identity_url=_go_str(fields.get("identity_url"), "identity_url"),
        authorizations=tuple(authorizations),
        expires=(time.monotonic() if now is None else now) + ttl,
    )


def _go_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Go matches JSON keys to struct fields case-insensitively, an exact match winning."""
    folded = {k.lower(): v for k, v in reversed(list(data.items()))}
    folded.update({k: v for k, v in data.items() if k == k.lower()})
    return folded


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _go_str(value: object, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AuthError(
            f"json: cannot unmarshal {_json_kind(value)} into Go value of type string ({name})"
        )
    return value


def _go_list(value: object, name: str, item_types: tuple[type, ...]) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise AuthError(
            f"json: cannot unmarshal {_json_kind(value)} into Go value of type []{name}"
        )
    for item in value:
        if item is not None and not isinstance(item, item_types):
            raise AuthError(f"json: cannot unmarshal {_json_kind(item)} into Go value ({name})")
    return value


# -- what nsqd sends ------------------------------------------------------------------------


def go_json(value: object) -> str:
    """JSON as Go's ``json.Marshal`` writes it (see :mod:`nsqpy.common.gojson`)."""
    return encode_json(value).decode()


def auth_reply(state: AuthState) -> bytes:
    """The AUTH command's answer to the client."""
    return go_json(
        {
            "identity": state.identity,
            "identity_url": state.identity_url,
            "permission_count": len(state.authorizations),
        }
    ).encode()


def auth_values(remote_ip: str, tls: bool, common_name: str, secret: bytes) -> dict[str, bytes]:
    """The form values ``QueryAuthd`` sends, by name."""
    return {
        "common_name": common_name.encode(),
        "remote_ip": remote_ip.encode(),
        "secret": secret,
        "tls": b"true" if tls else b"false",
    }


def encode_values(values: Mapping[str, bytes]) -> str:
    """Go's ``url.Values.Encode``: sorted by key, ``QueryEscape``d (space as ``+``)."""
    from urllib.parse import quote_plus  # loaded when first used: most nsqds have no auth

    return "&".join(f"{quote_plus(k)}={quote_plus(values[k])}" for k in sorted(values))


def _post_body(values: Mapping[str, bytes]) -> bytes:
    """``json.Marshal(url.Values)``: a map of one-element lists, keys sorted; bytes that
    are not UTF-8 become U+FFFD, as in Go."""
    return go_json({k: [values[k].decode("utf-8", "replace")] for k in sorted(values)}).encode()


def _https_endpoint(endpoint: str, body: bytes) -> str:
    """Go's ``httpsEndpoint``: the same URL on https at the ``https_port`` of a 403."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise AuthError(str(err)) from None
    port = data.get("https_port", 0) if isinstance(data, dict) else 0
    if isinstance(port, bool) or not isinstance(port, int):
        raise AuthError("json: cannot unmarshal https_port")
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(endpoint)
    host, sep, _ = parts.netloc.rpartition(":")
    if not sep or (host.count(":") and not host.startswith("[")):
        raise AuthError(f"address {parts.netloc}: missing port in address")
    return urlunsplit(("https", f"{host}:{port}", parts.path, parts.query, parts.fragment))


class AuthClient:
    """Asks the ``--auth-http-address`` servers, one after the other from a random one,
    until one answers (Go's ``QueryAnyAuthd``). One per nsqd; :meth:`close` at exit."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        method: str = "get",
        connect_timeout: float = 2.0,
        request_timeout: float = 5.0,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.addresses = list(addresses)
        self.method = method
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.tls_context = tls_context
        self._session: Any = None  # aiohttp.ClientSession, made on first use (needs a loop)

    async def query(
        self, *, remote_ip: str, tls: bool, common_name: str, secret: bytes
    ) -> AuthState:
        """The first usable answer; raises :class:`AuthError` with every server's failure."""
        values = auth_values(remote_ip, tls, common_name, secret)
        errors: list[str] = []
        n = len(self.addresses)
        start = random.randrange(n) if n else 0
        for i in range(n):
            address = self.addresses[(start + i) % n]
            try:
                return await self.query_one(address, values)
            except AuthError as err:
                errors.append(f"failed to auth against {address} - {err}")
        raise AuthError("; ".join(errors) or "no auth server")

    async def query_one(self, address: str, values: Mapping[str, bytes]) -> AuthState:
        """Go's ``QueryAuthd`` against one server."""
        import aiohttp
        from yarl import URL

        endpoint = address if "://" in address else f"http://{address}/auth"
        headers = {"Accept": ACCEPT_V1}
        data: bytes | None = None
        if self.method == "post":
            data = _post_body(values)
            headers["Content-Type"] = "application/json"
        else:
            endpoint = f"{endpoint}?{encode_values(values)}"
        session = self._get_session()
        try:
            while True:
                async with session.request(
                    "POST" if data is not None else "GET",
                    URL(endpoint, encoded=True),
                    data=data,
                    headers=headers,
                    allow_redirects=True,
                ) as resp:
                    body = await resp.read()
                if resp.status == 200:
                    break
                if resp.status == 403 and not endpoint.startswith("https"):
                    endpoint = _https_endpoint(endpoint, body)
                    continue
                raise AuthError(
                    f"got response {resp.status} {resp.reason} {json.dumps(body.decode('utf-8', 'replace'))}"
                )
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
            raise AuthError(str(err) or type(err).__name__) from None
        return parse_auth_response(body)

    def _get_session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=self.request_timeout, connect=self.connect_timeout
                ),
                connector=aiohttp.TCPConnector(ssl=self.tls_context or True),
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        """Close the HTTP session (open connections to the auth servers)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
