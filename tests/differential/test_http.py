"""nsqd's HTTP API, the same requests at Go's nsqd and nsqpy's.

Compared: status line, Content-Type, X-NSQ-Content-Type, Allow, Connection, the body
(JSON parsed; /info and /stats reduced to what Go has and answers deterministically) and
any 1xx reply before the final one; then /stats. Requests are written byte for byte on
kept-alive connections, as a publisher does, including the very same head repeated.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.differential.generators import HTTPCase, gen_http
from tests.differential.harness import (
    MAGIC,
    MAX_BODY_SIZE,
    MAX_MSG_SIZE,
    MAX_REQ_TIMEOUT_MS,
    HTTPConn,
    HTTPReply,
    Pair,
    StatsWatch,
    command,
    diff_text,
    examples,
    http_request,
    mpub_payload,
    norm_http,
    norm_stats,
    report,
    run_script,
    seed,
)

# /info keys that differ by nature between two processes: ports and start time
INFO_VARYING = ("start_time", "http_port", "tcp_port")


def json_norm_for(target: str, server: Any) -> Callable[[Any], Any] | None:
    path = target.split("?")[0]
    if path.startswith("/config/"):
        # an option Go fills in with the port it really listens on (broadcast ports, the
        # statsd prefix's %s): the port named as whose it is
        tcp = int(server.tcp_address.rpartition(":")[2])
        http = int(server.http_address.rpartition(":")[2])
        names = {tcp: "<its tcp port>", http: "<its http port>"}

        def norm(value: Any) -> Any:
            if isinstance(value, int):
                return names.get(value, value)
            if isinstance(value, str | bytes):
                for number, name in names.items():
                    value = value.replace(*((str(number), name) if isinstance(value, str)
                                            else (b"%d" % number, name.encode())))  # fmt: skip
            return value

        return norm
    if path == "/info":
        return lambda info: {k: v for k, v in info.items() if k not in INFO_VARYING}
    if path == "/stats":
        return lambda stats: (
            norm_stats(stats) if isinstance(stats, dict) and "topics" in stats else stats
        )
    return None


def norm_reply(reply: HTTPReply | str, target: str, server: Any) -> Any:
    if isinstance(reply, str):
        return reply  # no reply: what happened instead
    json_norm = json_norm_for(target, server)
    out = norm_http(reply, json_norm=json_norm)
    if json_norm is not None and isinstance(out["body"], bytes):
        out["body"] = json_norm(out["body"])  # a string option: raw text
    out["connection"] = reply.header("connection")
    return out


class Client:
    """One kept-alive connection to a server, reopened only when the server closed it
    (or said it would)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.conn = HTTPConn(address)
        self.closing = False  # the last reply said the server closes the connection

    def send(self, data: bytes) -> None:
        if self.closing or self.conn.closed_by_server():
            self.conn.close()
            self.conn = HTTPConn(self.address)
            self.closing = False
        self.conn.send(data)

    def reply(self, method: str) -> HTTPReply | str:
        try:
            reply = self.conn.read_reply(method)
        except EOFError:
            self.closing = True
            return "closed without a reply"
        connection = (reply.header("connection") or "").lower()
        http10 = reply.status_line.startswith(b"HTTP/1.0")
        self.closing = connection == "close" or (http10 and connection != "keep-alive")
        return reply

    def close(self) -> None:
        self.conn.close()


class Clients:
    """A client per server; ``exchange`` sends the same request to both, compares."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.go = Client(pair.go.http_address)
        self.py = Client(pair.py.http_address)

    def exchange(self, method: str, target: str, data: bytes) -> tuple[Any, Any]:
        replies = []
        for client, server in ((self.go, self.pair.go), (self.py, self.pair.py)):
            client.send(data)
            replies.append(norm_reply(client.reply(method), target, server))
        return replies[0], replies[1]

    def exchange_batch(self, batch: Sequence[tuple[str, str, bytes]]) -> tuple[Any, Any]:
        """Several requests in one write (pipelined); the replies, in order."""
        replies = []
        for client, server in ((self.go, self.pair.go), (self.py, self.pair.py)):
            client.send(b"".join(data for _, _, data in batch))
            got = []
            for method, target, _ in batch:
                reply = client.reply(method)
                got.append(norm_reply(reply, target, server))
                if isinstance(reply, str):
                    break
            replies.append(got)
        return replies[0], replies[1]

    def close(self) -> None:
        self.go.close()
        self.py.close()


@pytest.fixture(scope="module")
def stats_watch(pair: Pair) -> StatsWatch:
    return StatsWatch(pair)


@pytest.fixture
def clients(pair: Pair) -> Any:
    both = Clients(pair)
    try:
        yield both
    finally:
        both.close()


def request(
    method: str, target: str, body: bytes | None = None, *headers: tuple[str, str]
) -> HTTPCase:
    return HTTPCase(method, target, body, tuple(headers))


# -- fixed requests --------------------------------------------------------------------------

TOO_BIG = b"x" * (MAX_MSG_SIZE + 1)
FIXED: dict[str, HTTPCase] = {
    "ping": request("GET", "/ping"),
    "info": request("GET", "/info"),
    "pub": request("POST", "/pub?topic=h_pub", b"hello"),
    "pub-max": request("POST", "/pub?topic=h_pub", b"x" * MAX_MSG_SIZE),
    "pub-too-big": request("POST", "/pub?topic=h_pub", TOO_BIG),
    "pub-empty-body": request("POST", "/pub?topic=h_pub", b""),
    "pub-empty-body-no-topic": request("POST", "/pub", b""),
    "pub-no-topic": request("POST", "/pub", b"x"),
    "pub-empty-topic": request("POST", "/pub?topic=", b"x"),
    "pub-invalid-topic": request("POST", "/pub?topic=bad/char", b"x"),
    "pub-65-topic": request("POST", "/pub?topic=" + "n" * 65, b"x"),
    "pub-64-topic": request("POST", "/pub?topic=" + "n" * 64, b"x"),
    "pub-ephemeral": request("POST", "/pub?topic=h_eph%23ephemeral", b"x"),
    "pub-defer-0": request("POST", "/pub?topic=h_defer&defer=0", b"x"),
    "pub-defer-max": request("POST", f"/pub?topic=h_defer&defer={MAX_REQ_TIMEOUT_MS}", b"x"),
    "pub-defer-max+1": request("POST", f"/pub?topic=h_defer&defer={MAX_REQ_TIMEOUT_MS + 1}", b"x"),
    "pub-defer-negative": request("POST", "/pub?topic=h_defer&defer=-1", b"x"),
    "pub-defer-text": request("POST", "/pub?topic=h_defer&defer=abc", b"x"),
    "pub-defer-empty": request("POST", "/pub?topic=h_defer&defer=", b"x"),
    "pub-defer-float": request("POST", "/pub?topic=h_defer&defer=1.5", b"x"),
    "pub-get": request("GET", "/pub?topic=h_pub"),
    "pub-put": request("PUT", "/pub?topic=h_pub", b"x"),
    "mpub-text": request("POST", "/mpub?topic=h_mpub", b"a\nb\n\nc\n"),
    "mpub-text-empty": request("POST", "/mpub?topic=h_mpub", b""),
    "mpub-text-newlines-only": request("POST", "/mpub?topic=h_mpub", b"\n\n"),
    "mpub-text-line-too-big": request("POST", "/mpub?topic=h_mpub", b"a\n" + TOO_BIG),
    "mpub-text-body-too-big": request(
        "POST", "/mpub?topic=h_mpub", b"a\n" * (MAX_BODY_SIZE // 2 + 1)
    ),
    "mpub-binary": request("POST", "/mpub?topic=h_mpub&binary=true", mpub_payload([b"a", b"b\nc"])),
    "mpub-binary-1": request("POST", "/mpub?topic=h_mpub&binary=1", mpub_payload([b"a"])),
    "mpub-binary-yes": request("POST", "/mpub?topic=h_mpub&binary=yes", mpub_payload([b"a"])),
    "mpub-binary-false": request("POST", "/mpub?topic=h_mpub&binary=false", b"a\nb"),
    "mpub-binary-zero-count": request(
        "POST", "/mpub?topic=h_mpub&binary=true", b"\x00\x00\x00\x00"
    ),
    "mpub-binary-cut": request(
        "POST", "/mpub?topic=h_mpub&binary=true", mpub_payload([b"abc"])[:-1]
    ),
    "mpub-binary-message-too-big": request(
        "POST", "/mpub?topic=h_mpub&binary=true", mpub_payload([TOO_BIG])
    ),
    "mpub-binary-empty-message": request(
        "POST", "/mpub?topic=h_mpub&binary=true", mpub_payload([b""])
    ),
    "mpub-binary-empty": request("POST", "/mpub?topic=h_mpub&binary=true", b""),
    "mpub-no-topic": request("POST", "/mpub", b"a"),
    "mpub-invalid-topic": request("POST", "/mpub?topic=bad*", b"a"),
    "topic-create": request("POST", "/topic/create?topic=h_topic"),
    "topic-create-again": request("POST", "/topic/create?topic=h_topic"),
    "topic-create-invalid": request("POST", "/topic/create?topic=bad*"),
    "topic-create-missing": request("POST", "/topic/create"),
    "topic-create-get": request("GET", "/topic/create?topic=h_topic"),
    "topic-pause": request("POST", "/topic/pause?topic=h_topic"),
    "topic-pause-unknown": request("POST", "/topic/pause?topic=h_nope"),
    "topic-pause-invalid": request("POST", "/topic/pause?topic=bad*"),
    "topic-unpause": request("POST", "/topic/unpause?topic=h_topic"),
    "topic-empty": request("POST", "/topic/empty?topic=h_pub"),
    "topic-empty-unknown": request("POST", "/topic/empty?topic=h_nope"),
    "topic-empty-invalid": request("POST", "/topic/empty?topic=bad*"),
    "channel-create": request("POST", "/channel/create?topic=h_topic&channel=c"),
    "channel-create-ephemeral": request(
        "POST", "/channel/create?topic=h_topic&channel=e%23ephemeral"
    ),
    "channel-create-unknown-topic": request("POST", "/channel/create?topic=h_nope&channel=c"),
    "channel-create-invalid": request("POST", "/channel/create?topic=h_topic&channel=bad*"),
    "channel-create-no-channel": request("POST", "/channel/create?topic=h_topic"),
    "channel-create-no-topic": request("POST", "/channel/create?channel=c"),
    "channel-pause": request("POST", "/channel/pause?topic=h_topic&channel=c"),
    "channel-pause-unknown": request("POST", "/channel/pause?topic=h_topic&channel=nope"),
    "channel-unpause": request("POST", "/channel/unpause?topic=h_topic&channel=c"),
    "channel-empty": request("POST", "/channel/empty?topic=h_topic&channel=c"),
    "channel-empty-unknown": request("POST", "/channel/empty?topic=h_topic&channel=nope"),
    "channel-delete": request("POST", "/channel/delete?topic=h_topic&channel=c"),
    "channel-delete-again": request("POST", "/channel/delete?topic=h_topic&channel=c"),
    "stats": request("GET", "/stats?format=json"),
    "stats-topic": request("GET", "/stats?format=json&topic=h_topic"),
    "stats-topic-missing": request("GET", "/stats?format=json&topic=h_nope"),
    "stats-channel": request("GET", "/stats?format=json&topic=h_topic&channel=e%23ephemeral"),
    "stats-channel-missing": request("GET", "/stats?format=json&topic=h_topic&channel=nope"),
    "stats-no-clients": request("GET", "/stats?format=json&include_clients=false"),
    "stats-post": request("POST", "/stats?format=json"),
    "topic-delete": request("POST", "/topic/delete?topic=h_topic"),
    "topic-delete-again": request("POST", "/topic/delete?topic=h_topic"),
    "topic-delete-invalid": request("POST", "/topic/delete?topic=bad*"),
    "topic-delete-missing": request("POST", "/topic/delete"),
    "config-max-msg-size": request("GET", "/config/max_msg_size"),
    "config-tcp-address": request("GET", "/config/tcp_address"),
    "config-id": request("GET", "/config/id"),
    # found: Go fills --broadcast-tcp-port=0 (the default) with the port it listens on
    "config-broadcast-tcp-port": request("GET", "/config/broadcast_tcp_port"),
    "config-broadcast-http-port": request("GET", "/config/broadcast_http_port"),
    # found: Go puts the broadcast address and port in the statsd prefix's %s
    "config-statsd-prefix": request("GET", "/config/statsd_prefix"),
    "config-unknown": request("GET", "/config/no_such_option"),
    "config-log-level-put": request("PUT", "/config/log_level", b"warn"),
    "config-log-level-put-bad": request("PUT", "/config/log_level", b"loud"),
    "config-log-level-put-empty": request("PUT", "/config/log_level", b""),
    "config-log-level-get": request("GET", "/config/log_level"),
    "config-log-level-back": request("PUT", "/config/log_level", b"info"),
    "config-put-other": request("PUT", "/config/max_msg_size", b"5"),
    "config-post": request("POST", "/config/log_level", b"info"),
    "not-found": request("GET", "/nope"),
    "removed-put": request("POST", "/put?topic=h_pub", b"x"),
    "removed-create-topic": request("GET", "/create_topic?topic=h_pub"),
    "ping-post": request("POST", "/ping"),
    "ping-head": request("HEAD", "/ping"),
    "info-delete": request("DELETE", "/info"),
    # found: Go's router (httprouter) answers a path that is not clean, or has a trailing
    # slash, with a redirect to the clean one (301 for GET, 307 for other methods, with
    # net/http's HTML body), and net/http answers "OPTIONS *" itself
    "get-double-slash": request("GET", "//ping"),
    "get-trailing-slash": request("GET", "/ping/"),
    "get-dot-segment": request("GET", "/stats/../ping"),
    "post-trailing-slash": request("POST", "/pub/?topic=h_pub", b"x"),
    "post-double-slash": request("POST", "//topic/create?topic=h_slash"),
    "options-star": request("OPTIONS", "*"),
}
# requests no helper writes: their bytes as they are
RAW: dict[str, tuple[str, str, bytes]] = {
    "pub-chunked": (
        "POST",
        "/pub?topic=h_pub",
        b"POST /pub?topic=h_pub HTTP/1.1\r\nHost: nsqd\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n",
    ),
    "pub-http10": (
        "POST",
        "/pub?topic=h_pub",
        b"POST /pub?topic=h_pub HTTP/1.0\r\nContent-Length: 1\r\n\r\nx",
    ),
    "ping-http10-keep-alive": (
        "GET",
        "/ping",
        b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    ),
    "ping-no-host": ("GET", "/ping", b"GET /ping HTTP/1.1\r\n\r\n"),
    "pub-duplicate-topic": (
        "POST",
        "/pub?topic=h_pub",
        b"POST /pub?topic=h_pub&topic=h_other HTTP/1.1\r\nHost: nsqd\r\nContent-Length: 1\r\n\r\nx",
    ),
    "pub-connection-close": (
        "POST",
        "/pub?topic=h_pub",
        b"POST /pub?topic=h_pub HTTP/1.1\r\nHost: nsqd\r\nConnection: close\r\n"
        b"Content-Length: 1\r\n\r\nx",
    ),
}


def raw(case: HTTPCase) -> bytes:
    return http_request(case.method, case.target, case.body, case.headers)


def assert_same(go: Any, py: Any, stats_diff: str | None, what: str = "request") -> None:
    """The replies are the same and so is /stats after them (both checked, then told)."""
    problems = [] if py == go else [f"replies differ:\n{diff_text(go, py)}"]
    if stats_diff is not None:
        problems.append(f"/stats differ after the {what}:\n{stats_diff}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case", FIXED.values(), ids=FIXED.keys())
def test_request(pair: Pair, stats_watch: StatsWatch, clients: Clients, case: HTTPCase) -> None:
    go, py = clients.exchange(case.method, case.target, raw(case))
    assert_same(go, py, stats_watch.check())


@pytest.mark.parametrize("case", RAW.values(), ids=RAW.keys())
def test_raw_request(
    pair: Pair, stats_watch: StatsWatch, clients: Clients, case: tuple[str, str, bytes]
) -> None:
    method, target, data = case
    go, py = clients.exchange(method, target, data)
    assert_same(go, py, stats_watch.check())


# -- the same head again and again on one kept-alive connection -------------------------------


def exchange_all(
    pair: Pair, requests: Sequence[tuple[str, str, bytes | None]], pipelined: bool
) -> tuple[list[Any], list[Any]]:
    """Send ``requests`` on one connection to each server (all in one write when
    ``pipelined``, else each after the previous reply); the replies."""
    out = []
    for server in (pair.go, pair.py):
        conn = HTTPConn(server.http_address)
        try:
            replies: list[Any] = []
            data = [http_request(m, t, b) for m, t, b in requests]
            if pipelined:
                conn.send(b"".join(data))
            for (method, target, _), d in zip(requests, data, strict=True):
                if not pipelined:
                    conn.send(d)
                try:
                    replies.append(norm_reply(conn.read_reply(method), target, server))
                except EOFError:
                    replies.append("closed without a reply")
                    break
        finally:
            conn.close()
        out.append(replies)
    return out[0], out[1]


REPEATED_TOPICS = ("ka_a", "", "ka_b", "", "bad/char", "n" * 65, "ka_a", "", "ka_a", "ka_a")


@pytest.mark.parametrize("pipelined", [False, True], ids=["one-by-one", "pipelined"])
def test_repeated_pub_head_varying_topics(
    pair: Pair, stats_watch: StatsWatch, pipelined: bool
) -> None:
    """The same /pub head, then the same head with another topic (the empty name among
    them), on one kept-alive connection."""
    requests = [("POST", f"/pub?topic={t}", b"body") for t in REPEATED_TOPICS]
    go, py = exchange_all(pair, requests, pipelined)
    assert_same(go, py, stats_watch.check())


@pytest.mark.parametrize("pipelined", [False, True], ids=["one-by-one", "pipelined"])
def test_repeated_pub_head_after_tcp_empty_topic(fresh_pair: Pair, pipelined: bool) -> None:
    """Known: after ``PUB \\n`` on TCP (which nsqpy took as topic ""), ``POST /pub?topic=``
    was answered 200 on a kept-alive connection; Go: 400 INVALID_TOPIC every time."""
    for server in (fresh_pair.go, fresh_pair.py):
        run_script(server.tcp_address, [MAGIC + command(b"PUB ", b"x")])
    requests = [("POST", f"/pub?topic={t}", b"body") for t in ("", "", "ka_c", "", "")]
    go, py = exchange_all(fresh_pair, requests, pipelined)
    assert all(r["body"] == {"message": "INVALID_TOPIC"} for i, r in enumerate(go) if i != 2)
    assert_same(go, py, StatsWatch(fresh_pair).check())


def test_repeated_heads_while_state_changes(pair: Pair, stats_watch: StatsWatch) -> None:
    """The same head repeated, between requests on the same connection that change what
    it acts on (pause, delete, a channel made and removed), and with other bodies."""
    steps: list[tuple[str, str, bytes | None]] = [
        ("POST", "/pub?topic=ka_state", b"x"),
        ("POST", "/topic/pause?topic=ka_state", None),
        ("POST", "/pub?topic=ka_state", b"x"),
        ("POST", "/topic/delete?topic=ka_state", None),
        ("POST", "/topic/delete?topic=ka_state", None),
        ("POST", "/pub?topic=ka_state", b"x"),
        ("POST", "/pub?topic=ka_state", b"x" * MAX_MSG_SIZE),
        ("POST", "/pub?topic=ka_state", TOO_BIG),
        ("POST", "/pub?topic=ka_state", b"x"),
        ("POST", "/channel/create?topic=ka_state&channel=c", None),
        ("POST", "/channel/create?topic=ka_state&channel=c", None),
        ("POST", "/pub?topic=ka_state", b"x"),
        ("GET", "/stats?format=json&topic=ka_state", None),
        ("POST", "/channel/delete?topic=ka_state&channel=c", None),
        ("GET", "/stats?format=json&topic=ka_state", None),
        ("POST", "/channel/delete?topic=ka_state&channel=c", None),
    ]
    go, py = exchange_all(pair, steps, pipelined=False)
    assert_same(go, py, stats_watch.check())


# -- Expect: 100-continue ------------------------------------------------------------------


def continue_exchange(address: str, wait_for_continue: bool) -> list[bytes]:
    """POST /pub with ``Expect: 100-continue``; the status lines of the replies, raw."""
    conn = HTTPConn(address)
    try:
        head = http_request("POST", "/pub?topic=h_continue", b"hello", [("Expect", "100-continue")])
        head, _, body = head.partition(b"\r\n\r\n")
        if wait_for_continue:
            conn.send(head + b"\r\n\r\n")
            interim = conn.read_line()  # the 100 Continue the body waits for
            assert conn.read_line() == b"", interim
            conn.send(body)
            reply = conn.read_reply("POST")
            return [interim, *reply.interim, reply.status_line]
        conn.send(head + b"\r\n\r\n" + body)
        reply = conn.read_reply("POST")
        return [*reply.interim, reply.status_line]
    finally:
        conn.close()


@pytest.mark.parametrize("wait", [False, True], ids=["body-with-head", "body-after-100"])
def test_expect_continue(pair: Pair, wait: bool) -> None:
    """Known: Go answers ``HTTP/1.1 100 Continue`` before the 200 even when the body came
    with the head; nsqpy's quick /pub lane answered 200 alone."""
    go = continue_exchange(pair.go.http_address, wait)
    py = continue_exchange(pair.py.http_address, wait)
    assert go == [b"HTTP/1.1 100 Continue", b"HTTP/1.1 200 OK"]
    assert py == go


# -- generated requests ---------------------------------------------------------------------


def test_generated_requests(pair: Pair, stats_watch: StatsWatch, clients: Clients) -> None:
    """Requests from the generator on one kept-alive connection per server, often the
    previous request again (the same head), sometimes two or three in one write."""
    case_seed = seed(7301)
    rng = random.Random(case_seed)
    divergences: list[str] = []
    previous: HTTPCase | None = None
    for number in range(examples(120)):
        batch = []
        for i in range(rng.choice((1, 1, 1, 2, 3))):
            if previous is not None and rng.random() < 0.3:
                case = previous
            else:
                case = gen_http(rng, f"hg{case_seed}_{number}_{i}_")
            batch.append(case)
            previous = case
        where = f"seed {case_seed} case {number}: " + "; ".join(
            f"{c.method} {c.target} body {c.body!r:.80}" for c in batch
        )
        go, py = clients.exchange_batch([(c.method, c.target, raw(c)) for c in batch])
        if go != py:
            divergences.append(f"{where}\n  replies:\n{diff_text(go, py)}")
        stats_diff = stats_watch.check()
        if stats_diff is not None:
            divergences.append(f"{where}\n  /stats after it:\n{stats_diff}")
        if len(divergences) >= 20:
            break
    assert not divergences, report(divergences)
