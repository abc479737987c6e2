"""The auth server client (nsqpy.nsqd.auth, spec §7.11): answers, permissions, Go regexps,
what is sent, and querying several servers (against in-process aiohttp servers)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable
from typing import Any

import pytest
from aiohttp import web

from nsqpy.nsqd.auth import (
    AuthClient,
    AuthError,
    Authorization,
    AuthState,
    auth_reply,
    auth_values,
    compile_go_regexp,
    encode_values,
    go_json,
    parse_auth_response,
)


def answer(**fields: Any) -> bytes:
    data: dict[str, Any] = {"ttl": 60, "identity": "me", "identity_url": "http://id/me"}
    data.update(fields)
    return json.dumps(data).encode()


# -- answers ------------------------------------------------------------------------------


def test_parse_answer() -> None:
    state = parse_auth_response(
        answer(
            authorizations=[
                {"topic": "orders", "channels": [".*"], "permissions": ["subscribe", "publish"]}
            ]
        ),
        now=1000.0,
    )
    assert state.ttl == 60
    assert state.expires == 1060.0
    assert (state.identity, state.identity_url) == ("me", "http://id/me")
    assert state.authorizations == (Authorization("orders", (".*",), ("subscribe", "publish")),)
    assert not state.is_expired(now=1059.9)
    assert state.is_expired(now=1060.1)


def test_parse_answer_like_go_unmarshal() -> None:
    # keys match case-insensitively, nulls are zero values, unknown keys are ignored
    state = parse_auth_response(
        b'{"TTL": 5, "Identity": null, "extra": 1, "authorizations": [null,'
        b' {"Topic": "t", "channels": null, "permissions": null}]}'
    )
    assert state.ttl == 5 and state.identity == ""
    assert state.authorizations == (Authorization(""), Authorization("t"))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (answer(ttl=0), "invalid TTL 0 (must be >0)"),
        (answer(ttl=-3), "invalid TTL -3 (must be >0)"),
        (b'{"identity": "x"}', "invalid TTL 0 (must be >0)"),
        (b"null", "invalid TTL 0"),
        (answer(ttl=1.5), "cannot unmarshal number 1.5"),
        (answer(ttl="60"), "cannot unmarshal string"),
        (b"[]", "cannot unmarshal array into Go value of type auth.State"),
        (b"not json", "invalid JSON"),
        (answer(identity=5), "cannot unmarshal number"),
        (answer(authorizations={}), "cannot unmarshal object"),
        (
            answer(authorizations=[{"topic": "t", "channels": [".*"], "permissions": ["admin"]}]),
            "unknown permission admin",
        ),
        (
            answer(authorizations=[{"topic": "(", "channels": [], "permissions": []}]),
            'unable to compile topic "("',
        ),
        (
            answer(authorizations=[{"topic": "t", "channels": ["[a-"], "permissions": []}]),
            'unable to compile channel "[a-"',
        ),
    ],
)
def test_parse_answer_errors(body: bytes, message: str) -> None:
    with pytest.raises(AuthError, match=re.escape(message)):
        parse_auth_response(body)


def test_permission_checks() -> None:
    state = AuthState(
        ttl=1,
        authorizations=(
            Authorization("^orders$", ("^billing$", "audit"), ("subscribe",)),
            Authorization("events", (".*",), ("publish",)),
            Authorization("nothing", (), ("publish", "subscribe")),
        ),
    )
    # subscribe: topic and one channel regex must match, unanchored unless anchored
    assert state.is_allowed("orders", "billing")
    assert state.is_allowed("orders", "audit_log")  # "audit" matches anywhere
    assert not state.is_allowed("orders", "billing2")
    assert not state.is_allowed("orders2", "billing")
    # publish: the channel is "", so a channel regex must match the empty string
    assert not state.is_allowed("orders", "")  # subscribe only
    assert state.is_allowed("events", "")
    assert state.is_allowed("my_events_topic", "")
    assert not state.is_allowed("events", "ch")  # publish only
    # an empty channel list allows nothing
    assert not state.is_allowed("nothing", "")
    assert not state.is_allowed("nothing", "ch")


def test_auth_reply_to_the_client() -> None:
    state = AuthState(
        ttl=1,
        identity="<bob>",
        identity_url="http://x/?a=1&b=2",
        authorizations=(Authorization("t"), Authorization("u")),
    )
    assert auth_reply(state) == (
        b'{"identity":"\\u003cbob\\u003e","identity_url":"http://x/?a=1\\u0026b=2",'
        b'"permission_count":2}'
    )


def test_go_json() -> None:
    assert go_json({"a": "é\u2028<&>", "b": [1]}) == '{"a":"é\\u2028\\u003c\\u0026\\u003e","b":[1]}'


# -- Go regexps ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("orders", ["orders", "xordersx"], ["order"]),
        ("^a.c$", ["abc"], ["abcd", "abc\n"]),  # RE2's $: end of text only
        ("abc\\z", ["xabc"], ["abc\n"]),
        ("\\Qa.b*\\E", ["xa.b*"], ["aab"]),
        ("^[[:alpha:]]+$", ["abcXYZ"], ["ab1"]),
        ("^[[:digit:][:lower:]_]+$", ["a_1"], ["A"]),
        ("^(?<name>x+)$", ["xxx"], ["y"]),
        ("^(?P<name>x+)$", ["xxx"], ["y"]),
        ("^\\101\\x42\\x{43}$", ["ABC"], ["abc"]),
        ("^\\pL+\\PL$", ["abc1"], ["abcd"]),
        ("^\\p{N}+$", ["123"], ["12a"]),
        ("(?i)^ORDERS$", ["orders"], ["order"]),
        ("^(?i:a)b$", ["Ab"], ["AB"]),
        ("[]a]", ["]"], ["b"]),
        ("^[^]a]$", ["b"], ["]"]),
        ("(?m)^b$", ["a\nb\nc"], ["abc"]),
        ("", ["", "anything"], []),
    ],
)
def test_go_regexp(pattern: str, matches: list[str], misses: list[str]) -> None:
    compiled = compile_go_regexp(pattern)
    for text in matches:
        assert compiled.search(text), (pattern, text)
    for text in misses:
        assert not compiled.search(text), (pattern, text)


@pytest.mark.parametrize(
    "pattern",
    [
        "(?=a)",  # look-ahead
        "(?!a)",
        "(?<=a)b",  # look-behind
        "(?<!a)b",
        "(a)\\1",  # back-reference (RE2 has none)
        "(?P<n>a)(?P=n)",
        "(?>a)",  # atomic group
        "a*+",  # possessive
        "a{2}+",
        "(?(1)a|b)",
        "(?#comment)",
        "(?x) a",
        "(?U)a*",
        "\\Z",
        "\\8",
        "[[:^alpha:]]",
        "\\p{Greek}",
        "(",
        "[a",
        "a**",
        "\\",
    ],
)
def test_go_regexp_refuses_what_re2_refuses(pattern: str) -> None:
    with pytest.raises(ValueError):
        compile_go_regexp(pattern)


def test_go_regexp_is_ascii() -> None:
    assert compile_go_regexp("^\\w+$").flags & re.ASCII
    assert not compile_go_regexp("^\\d$").search("\u0663")  # Arabic-Indic three


# -- what nsqd sends -----------------------------------------------------------------------


def test_query_values_like_go_url_values() -> None:
    values = auth_values("10.0.0.1", True, "client cn", b"s3cr&t =+/\xff")
    assert encode_values(values) == (
        "common_name=client+cn&remote_ip=10.0.0.1&secret=s3cr%26t+%3D%2B%2F%FF&tls=true"
    )
    assert encode_values(auth_values("", False, "", b"")) == (
        "common_name=&remote_ip=&secret=&tls=false"
    )


# -- against auth servers ------------------------------------------------------------------


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await asyncio.wait_for(coro, 20)

    return asyncio.run(main())


def test_get_query() -> None:
    seen: list[web.Request] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request)
        return web.Response(
            body=answer(
                authorizations=[{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]
            )
        )

    async def scenario() -> AuthState:
        app = web.Application()
        app.router.add_route("*", "/auth", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        address = f"127.0.0.1:{runner.addresses[0][1]}"
        client = AuthClient([address])
        try:
            return await client.query(
                remote_ip="1.2.3.4", tls=False, common_name="", secret=b"a b&c"
            )
        finally:
            await client.close()
            await runner.cleanup()

    state = run(scenario())
    assert state.identity == "me" and len(state.authorizations) == 1
    [request] = seen
    assert request.method == "GET"
    assert request.raw_path == "/auth?common_name=&remote_ip=1.2.3.4&secret=a+b%26c&tls=false"
    assert request.headers["Accept"] == "application/vnd.nsq; version=1.0"


def test_post_body() -> None:
    seen: list[tuple[str, str, str, bytes]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(
            (request.method, request.query_string, request.content_type, await request.read())
        )
        return web.Response(body=answer())

    async def scenario() -> AuthState:
        app = web.Application()
        app.router.add_route("*", "/custom/path", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/custom/path"  # full URL: used as is
        client = AuthClient([url], method="post")
        try:
            return await client.query(remote_ip="::1", tls=True, common_name="cn", secret=b"s<>")
        finally:
            await client.close()
            await runner.cleanup()

    run(scenario())
    [(method, query, content_type, body)] = seen
    assert (method, query, content_type) == ("POST", "", "application/json")
    assert body == (
        b'{"common_name":["cn"],"remote_ip":["::1"],"secret":["s\\u003c\\u003e"],"tls":["true"]}'
    )


def test_servers_tried_in_turn_and_errors_collected() -> None:
    calls: list[str] = []

    async def failing(request: web.Request) -> web.Response:
        calls.append("failing")
        return web.Response(status=500, text="boom")

    async def bad_ttl(request: web.Request) -> web.Response:
        calls.append("bad_ttl")
        return web.Response(body=answer(ttl=0))

    async def good(request: web.Request) -> web.Response:
        calls.append("good")
        return web.Response(body=answer(identity="good"))

    async def scenario() -> tuple[list[str], str, set[str]]:
        runners = []
        addresses = []
        for handler in (failing, bad_ttl, good):
            app = web.Application()
            app.router.add_route("*", "/auth", handler)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
            addresses.append(f"127.0.0.1:{runner.addresses[0][1]}")
        down = "127.0.0.1:1"  # nothing listens there
        try:
            starts = set()
            for _ in range(30):  # the first server tried is random; every order works
                calls.clear()
                client = AuthClient([down, *addresses], connect_timeout=1, request_timeout=2)
                state = await client.query(remote_ip="", tls=False, common_name="", secret=b"")
                await client.close()
                assert state.identity == "good"
                starts.add(calls[0] if calls else "down-or-good")
            client = AuthClient([down, addresses[0], addresses[1]])
            try:
                await client.query(remote_ip="", tls=False, common_name="", secret=b"")
            except AuthError as err:
                message = str(err)
            await client.close()
            return calls, message, starts
        finally:
            for runner in runners:
                await runner.cleanup()

    _, message, starts = run(scenario())
    assert len(starts) >= 2  # a random start, not always the first address
    assert message.count("failed to auth against") == 3
    assert "got response 500 Internal Server Error" in message
    assert "invalid TTL 0 (must be >0)" in message
    assert "failed to auth against 127.0.0.1:1 - " in message


def test_403_with_https_port_retries_on_https() -> None:
    from nsqpy.nsqd.auth import _https_endpoint

    assert (
        _https_endpoint(
            "http://10.0.0.1:4151/auth?a=1", b'{"message": "TLS_REQUIRED", "https_port": 4152}'
        )
        == "https://10.0.0.1:4152/auth?a=1"
    )
    with pytest.raises(AuthError):
        _https_endpoint("http://10.0.0.1:4151/auth", b"not json")
