"""Authorization through an auth server (spec §2.2, §2.3 AUTH, §7.11): an aiohttp auth
server runs inside the test on 127.0.0.1:0 and answers per secret; nsqd is a real
process; clients are raw sockets (byte-exact errors) and pynsq with ``auth_secret``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trustme
from aiohttp import web

from nsqpy.wire.v2 import encode_pub
from tests.support.procs import ServerProcess
from tests.support.pynsq_client import pynsq_round_trip
from tests.support.rawclient import RawClient, int32, mpub_body
from tests.support.secure_client import SecureClient, client_context

pytestmark = pytest.mark.timeout(60)

NsqdFactory = Callable[..., ServerProcess]


def grant(
    topic: str = ".*", channels: list[str] | None = None, permissions: list[str] | None = None
) -> dict[str, Any]:
    return {
        "topic": topic,
        "channels": [".*"] if channels is None else channels,
        "permissions": ["subscribe", "publish"] if permissions is None else permissions,
    }


def answer(
    *authorizations: dict[str, Any], ttl: int = 3600, identity: str = "alice"
) -> dict[str, Any]:
    return {
        "ttl": ttl,
        "identity": identity,
        "identity_url": f"https://people.example/{identity}",
        "authorizations": list(authorizations),
    }


@dataclass
class AuthRequest:
    method: str
    path_qs: str
    secret: str
    values: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class AuthServer:
    """Answers ``answers[secret]`` (a JSON-able answer, or ``(status, body)``)."""

    answers: dict[str, Any] = field(default_factory=dict)
    requests: list[AuthRequest] = field(default_factory=list)
    delay: float = 0.0  # seconds before answering
    address: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.method == "POST":
            values = {k: v[0] for k, v in json.loads(body).items()}
        else:
            values = dict(request.query)
        secret = values.get("secret", "")
        self.requests.append(
            AuthRequest(
                request.method, request.path_qs, secret, values, dict(request.headers), body
            )
        )
        if self.delay:
            await asyncio.sleep(self.delay)
        found = self.answers.get(secret, (403, "no"))
        if isinstance(found, tuple):
            status, text = found
            return web.Response(status=status, text=text)
        return web.json_response(found)

    def start(self) -> str:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_route("*", "/auth", self._handle)
            self._runner = web.AppRunner(app)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.address = f"127.0.0.1:{self._runner.addresses[0][1]}"
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="auth-server", daemon=True)
        self._thread.start()
        assert ready.wait(10)
        return self.address

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)


@pytest.fixture
def authd() -> Iterator[AuthServer]:
    server = AuthServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def auth_nsqd(nsqd_factory: NsqdFactory, authd: AuthServer) -> ServerProcess:
    return nsqd_factory(auth_http_address=authd.address)


def authed(server: ServerProcess, secret: bytes) -> RawClient:
    client = RawClient(server.tcp_address)
    client.send_cmd(b"AUTH", body=secret)
    frame = client.next_frame()
    assert frame.type == 0, frame
    return client


# -- AUTH ---------------------------------------------------------------------------------


def test_identify_says_auth_is_required(
    auth_nsqd: ServerProcess, shared_nsqd: ServerProcess
) -> None:
    for server, required in ((auth_nsqd, True), (shared_nsqd, False)):
        client = RawClient(server.tcp_address)
        frame = client.identify(feature_negotiation=True)
        assert json.loads(frame.data)["auth_required"] is required
        client.close()


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (b"SUB t ch\n", "SUB"),
        (encode_pub("t", b"x"), "PUB"),
        (b"MPUB t\n" + int32(9) + mpub_body([b"x"]), "MPUB"),
        (b"DPUB t 0\n" + int32(1) + b"x", "DPUB"),
    ],
)
def test_commands_need_auth_first(auth_nsqd: ServerProcess, command: bytes, name: str) -> None:
    client = RawClient(auth_nsqd.tcp_address)
    client.send(command)
    client.expect_error(f"E_AUTH_FIRST AUTH required before {name}")


def test_other_commands_need_no_auth(auth_nsqd: ServerProcess) -> None:
    client = RawClient(auth_nsqd.tcp_address)
    client.identify_ok()
    client.nop()
    client.send(b"RDY 1\n")
    client.expect_error("E_INVALID cannot RDY in current state")  # a state error, not auth


def test_auth_allow_and_deny(auth_nsqd: ServerProcess, authd: AuthServer, topic: str) -> None:
    authd.answers["s3cret"] = answer(
        grant(f"^{topic}$", ["^allowed$"], ["subscribe"]),
        grant(f"^{topic}", [".*"], ["publish"]),
        identity="alice",
    )
    client = RawClient(auth_nsqd.tcp_address)
    client.send_cmd(b"AUTH", body=b"s3cret")
    reply = client.next_frame()
    assert reply.type == 0
    assert json.loads(reply.data) == {
        "identity": "alice",
        "identity_url": "https://people.example/alice",
        "permission_count": 2,
    }
    client.pub(topic, b"allowed")
    client.pub(topic + "_suffix", b"unanchored end: allowed")
    client.mpub(topic, [b"a", b"b"])
    client.dpub(topic, 10, b"d")
    client.sub(topic, "allowed")
    # the request nsqd made
    [request] = authd.requests
    assert request.method == "GET"
    assert request.path_qs == "/auth?common_name=&remote_ip=127.0.0.1&secret=s3cret&tls=false"
    assert request.headers["Accept"] == "application/vnd.nsq; version=1.0"
    # stats
    with urllib.request.urlopen(
        f"http://{auth_nsqd.http_address}/stats?format=json&topic={topic}"
    ) as r:
        stats = json.load(r)
    [entry] = [c for t in stats["topics"] for ch in t["channels"] for c in ch["clients"]]
    assert entry["authed"] is True
    assert (entry["auth_identity"], entry["auth_identity_url"]) == (
        "alice",
        "https://people.example/alice",
    )

    for command, error in [
        (encode_pub("other", b"x"), 'E_UNAUTHORIZED AUTH failed for PUB on "other" ""'),
        (
            b"SUB " + topic.encode() + b" other\n",
            f'E_UNAUTHORIZED AUTH failed for SUB on "{topic}" "other"',
        ),
        (
            b"MPUB x" + topic.encode() + b"\n" + int32(9) + mpub_body([b"x"]),
            f'E_UNAUTHORIZED AUTH failed for MPUB on "x{topic}" ""',
        ),
        (b"DPUB other 5\n" + int32(1) + b"x", 'E_UNAUTHORIZED AUTH failed for DPUB on "other" ""'),
    ]:
        denied = authed(auth_nsqd, b"s3cret")
        denied.send(command)
        denied.expect_error(error)


def test_publish_needs_a_channel_regex_matching_empty(
    auth_nsqd: ServerProcess, authd: AuthServer, topic: str
) -> None:
    authd.answers["s"] = answer(grant(".*", ["^ch$"], ["publish"]))
    client = authed(auth_nsqd, b"s")
    client.send(encode_pub(topic, b"x"))
    client.expect_error(f'E_UNAUTHORIZED AUTH failed for PUB on "{topic}" ""')


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (answer(), "E_UNAUTHORIZED AUTH no authorizations found"),
        ((500, "boom"), "E_AUTH_FAILED AUTH failed"),
        ((403, "forbidden"), "E_AUTH_FAILED AUTH failed"),
        ((200, "not json"), "E_AUTH_FAILED AUTH failed"),
        (answer(grant(), ttl=0), "E_AUTH_FAILED AUTH failed"),
        (answer(grant(permissions=["admin"])), "E_AUTH_FAILED AUTH failed"),
        (answer(grant(topic="(?=x)")), "E_AUTH_FAILED AUTH failed"),  # RE2 has no look-ahead
    ],
)
def test_auth_failures(
    auth_nsqd: ServerProcess, authd: AuthServer, response: Any, error: str
) -> None:
    authd.answers["s"] = response
    client = RawClient(auth_nsqd.tcp_address)
    client.send_cmd(b"AUTH", body=b"s")
    client.expect_error(error)


def test_auth_errors_in_gos_order(
    auth_nsqd: ServerProcess, shared_nsqd: ServerProcess, authd: AuthServer
) -> None:
    authd.answers["s"] = answer(grant())
    client = authed(auth_nsqd, b"s")
    client.send_cmd(b"AUTH", body=b"s")
    client.expect_error("E_INVALID AUTH already set")
    client = RawClient(auth_nsqd.tcp_address)
    client.send(b"AUTH extra\n")
    client.expect_error("E_INVALID AUTH invalid number of parameters")
    client = RawClient(shared_nsqd.tcp_address)
    client.send_cmd(b"AUTH", body=b"s")
    client.expect_error("E_AUTH_DISABLED AUTH disabled")
    client = RawClient(auth_nsqd.tcp_address)
    client.send(b"SUB bad!topic ch\n")  # SUB validates its names before CheckAuth
    client.expect_error('E_BAD_TOPIC SUB topic name "bad!topic" is not valid')


def test_auth_after_sub_is_refused(auth_nsqd: ServerProcess, authd: AuthServer, topic: str) -> None:
    authd.answers["s"] = answer(grant())
    client = authed(auth_nsqd, b"s")
    client.sub(topic, "ch")
    client.send_cmd(b"AUTH", body=b"s")
    client.expect_error("E_INVALID cannot AUTH in current state")


# -- expiry ------------------------------------------------------------------------------------


def test_ttl_expiry_queries_again(auth_nsqd: ServerProcess, authd: AuthServer, topic: str) -> None:
    authd.answers["s"] = answer(grant(), ttl=1)
    client = authed(auth_nsqd, b"s")
    client.pub(topic, b"1")
    assert len(authd.requests) == 1
    time.sleep(1.2)
    client.pub(topic, b"2")  # expired: a new query, then the PUB
    assert len(authd.requests) == 2
    client.pub(topic, b"3")
    assert len(authd.requests) == 2
    # pipelined commands wait for the query, in order
    time.sleep(1.2)
    client.send(b"".join(encode_pub(topic, b"p%d" % i) for i in range(5)) + b"NOP\n")
    for _ in range(5):
        client.expect_response(b"OK")
    assert len(authd.requests) == 3
    # the answer changed: denied now
    authd.answers["s"] = answer(grant(topic="^nothing$"), ttl=1)
    time.sleep(1.2)
    client.send(encode_pub(topic, b"4"))
    client.expect_error(f'E_UNAUTHORIZED AUTH failed for PUB on "{topic}" ""')


def test_ttl_expiry_then_server_failure(
    auth_nsqd: ServerProcess, authd: AuthServer, topic: str
) -> None:
    authd.answers["s"] = answer(grant(), ttl=1)
    client = authed(auth_nsqd, b"s")
    client.sub(topic, "ch")
    producer = authed(auth_nsqd, b"s")
    authd.answers["s"] = (500, "down")
    time.sleep(1.2)
    producer.send(encode_pub(topic, b"x"))
    producer.expect_error("E_AUTH_FAILED AUTH failed")


def test_ttl_expiry_then_no_authorizations(
    auth_nsqd: ServerProcess, authd: AuthServer, topic: str
) -> None:
    authd.answers["s"] = answer(grant(), ttl=1)
    client = authed(auth_nsqd, b"s")
    authd.answers["s"] = answer(ttl=5)
    time.sleep(1.2)
    client.send(encode_pub(topic, b"x"))
    client.expect_error(f'E_UNAUTHORIZED AUTH failed for PUB on "{topic}" ""')


def test_slow_auth_server_is_no_read_timeout(
    auth_nsqd: ServerProcess, authd: AuthServer, topic: str
) -> None:
    """While nsqd waits for the auth server it reads nothing, so no read deadline runs
    (heartbeats still go out)."""
    authd.answers["s"] = answer(grant())
    authd.delay = 2.5  # more than 2 heartbeat intervals
    client = RawClient(auth_nsqd.tcp_address, timeout=8)
    client.identify_ok(heartbeat_interval=1000)
    client.send_cmd(b"AUTH", body=b"s")
    frame = client.next_frame(answer_heartbeats=False)
    assert json.loads(frame.data)["identity"] == "alice"
    client.pub(topic, b"x")


def test_ttl_expiry_with_durable_acks(
    nsqd_factory: NsqdFactory, authd: AuthServer, topic: str
) -> None:
    server = nsqd_factory(auth_http_address=authd.address, sync_every=1)
    authd.answers["s"] = answer(grant(), ttl=1)
    client = authed(server, b"s")
    client.send(b"".join(encode_pub(topic, b"a%d" % i) for i in range(3)))
    time.sleep(1.2)  # expires while those acknowledgements may still wait for fsync
    client.send(b"".join(encode_pub(topic, b"b%d" % i) for i in range(3)))
    for _ in range(6):
        client.expect_response(b"OK")
    consumer = authed(server, b"s")
    consumer.sub(topic, "ch")
    consumer.rdy(10)
    assert [m.body for m in consumer.read_messages(6)] == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]


# -- servers and methods ---------------------------------------------------------------------


def test_post_method(nsqd_factory: NsqdFactory, authd: AuthServer, topic: str) -> None:
    server = nsqd_factory(auth_http_address=authd.address, auth_http_request_method="post")
    authd.answers["p<&>"] = answer(grant())
    client = authed(server, b"p<&>")
    client.pub(topic, b"x")
    [request] = authd.requests
    assert request.method == "POST"
    assert request.path_qs == "/auth"
    assert request.headers["Content-Type"] == "application/json"
    assert request.body == (
        b'{"common_name":[""],"remote_ip":["127.0.0.1"],"secret":["p\\u003c\\u0026\\u003e"],'
        b'"tls":["false"]}'
    )


def test_full_url_address(nsqd_factory: NsqdFactory, authd: AuthServer, topic: str) -> None:
    server = nsqd_factory(auth_http_address=f"http://{authd.address}/auth")
    authd.answers["s"] = answer(grant())
    authed(server, b"s").pub(topic, b"x")
    assert authd.requests[0].path_qs.startswith("/auth?common_name=")


def test_several_servers_first_down(
    nsqd_factory: NsqdFactory, authd: AuthServer, topic: str
) -> None:
    server = nsqd_factory(auth_http_address=["127.0.0.1:1", authd.address])
    authd.answers["s"] = answer(grant())
    for _ in range(6):  # the first server tried is random: both orders must work
        client = authed(server, b"s")
        client.pub(topic, b"x")
        client.close()
    assert len(authd.requests) == 6


def test_all_servers_down(nsqd_factory: NsqdFactory) -> None:
    server = nsqd_factory(auth_http_address=["127.0.0.1:1", "127.0.0.1:2"])
    client = RawClient(server.tcp_address)
    client.send_cmd(b"AUTH", body=b"s")
    client.expect_error("E_AUTH_FAILED AUTH failed")
    line = server.wait_for_log(r"AUTH failed failed to auth against").string
    assert "127.0.0.1:1" in line and "127.0.0.1:2" in line


def test_auth_over_tls_sends_common_name(
    nsqd_factory: NsqdFactory, authd: AuthServer, tmp_path: Any, topic: str
) -> None:
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1")
    client_cert = ca.issue_cert("client@example.com", common_name="client-cn")
    paths = {}
    for name, blob in [
        ("ca", ca.cert_pem),
        ("cert", server_cert.cert_chain_pems[0]),
        ("key", server_cert.private_key_pem),
        ("ccert", client_cert.cert_chain_pems[0]),
        ("ckey", client_cert.private_key_pem),
    ]:
        blob.write_to_path(str(tmp_path / name))
        paths[name] = str(tmp_path / name)
    server = nsqd_factory(
        auth_http_address=authd.address,
        tls_cert=paths["cert"],
        tls_key=paths["key"],
        tls_client_auth_policy="require-verify",
        tls_root_ca_file=paths["ca"],
    )
    authd.answers["s"] = answer(grant())
    client = SecureClient(server.tcp_address)
    reply = client.negotiate(tls=client_context(paths["ca"], cert=(paths["ccert"], paths["ckey"])))
    assert isinstance(reply, dict) and reply["auth_required"] is True
    client.send_cmd(b"AUTH", body=b"s")
    assert client.next_frame().type == 0
    client.pub(topic, b"x")
    [request] = authd.requests
    assert request.values == {
        "common_name": "client-cn",
        "remote_ip": "127.0.0.1",
        "secret": "s",
        "tls": "true",
    }


# -- pynsq ------------------------------------------------------------------------------------


def test_pynsq_auth_secret(auth_nsqd: ServerProcess, authd: AuthServer, topic: str) -> None:
    authd.answers["pynsq-secret"] = answer(grant(f"^{topic}$"), identity="pynsq")
    bodies = [b"a-%d" % i for i in range(10)]

    responses, received = pynsq_round_trip(
        auth_nsqd.tcp_address, topic, "auth", bodies, auth_secret="pynsq-secret"
    )
    assert responses == [b"OK"] * len(bodies)
    assert received == bodies
    assert {r.secret for r in authd.requests} == {"pynsq-secret"}
