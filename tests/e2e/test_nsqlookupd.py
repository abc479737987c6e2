"""nsqlookupd as a real process: the TCP protocol V1 byte-exact, every HTTP route and error,
and the registration rules (spec §4). nsqd is played by a raw socket here; the
nsqd ↔ nsqlookupd tests are in test_discovery.py.

The helpers at the top (the ``LOOKUPD`` spec, :class:`LookupdClient`, :func:`http`,
:func:`wait_until`) are shared with test_discovery.py.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPMessage
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.procs import ServerPool, ServerProcess, ServerSpec, run_once, start_server

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


def _lookupd_default_args(_: Path) -> list[str]:
    return [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    ]


LOOKUPD = ServerSpec(
    name="nsqlookupd",
    module="nsqpy.nsqlookupd",
    default_args=_lookupd_default_args,
    ready=("tcp", "http"),
)

PEER = {
    "version": "1.3.0",
    "tcp_port": 4150,
    "http_port": 4151,
    "hostname": "fake-nsqd",
    "broadcast_address": "10.1.2.3",
}


# -- helpers ----------------------------------------------------------------------------------


def int32(n: int) -> bytes:
    return struct.pack(">i", n)


def reply(data: bytes | str) -> bytes:
    """A V1 reply on the wire: ``[size][data]``."""
    raw = data.encode() if isinstance(data, str) else data
    return int32(len(raw)) + raw


class LookupdClient:
    """A raw V1 connection to nsqlookupd, playing nsqd."""

    def __init__(self, address: str, *, magic: bytes | None = b"  V1", timeout: float = 5.0):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        self._buf = b""
        if magic is not None:
            self.sock.sendall(magic)

    @property
    def address(self) -> str:
        """This end's ``ip:port``: the producer id nsqlookupd knows us by."""
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_reply(self) -> bytes:
        while True:
            if len(self._buf) >= 4:
                (size,) = struct.unpack(">i", self._buf[:4])
                if len(self._buf) >= 4 + size:
                    data, self._buf = self._buf[4 : 4 + size], self._buf[4 + size :]
                    return data
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed by nsqlookupd; partial reply {self._buf!r}")
            self._buf += chunk

    def command(self, data: bytes) -> bytes:
        self.send(data)
        return self.read_reply()

    def identify(self, **fields: Any) -> dict[str, Any]:
        body = json.dumps({**PEER, **fields}).encode()
        result: dict[str, Any] = json.loads(self.command(b"IDENTIFY\n" + int32(len(body)) + body))
        return result

    def register(self, topic: str, channel: str = "") -> None:
        assert self.command(f"REGISTER {topic} {channel}".strip().encode() + b"\n") == b"OK"

    def unregister(self, topic: str, channel: str = "") -> None:
        assert self.command(f"UNREGISTER {topic} {channel}".strip().encode() + b"\n") == b"OK"

    def read_all(self) -> bytes:
        """Everything until nsqlookupd closes the connection (fails if it does not)."""
        data = self._buf
        self._buf = b""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return data
            data += chunk

    def close(self) -> None:
        self.sock.close()


@dataclass
class Response:
    status: int
    headers: HTTPMessage
    body: bytes

    def json(self) -> Any:
        assert self.headers["Content-Type"] == "application/json; charset=utf-8", self.headers
        return json.loads(self.body)


def http(address: str, method: str, path: str, body: bytes | None = None) -> Response:
    """One HTTP request, the raw response (no redirects followed)."""
    host, _, port = address.rpartition(":")
    conn = HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return Response(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def get_json(address: str, path: str) -> Any:
    resp = http(address, "GET", path)
    assert resp.status == 200, (path, resp.status, resp.body)
    return resp.json()


def wait_until(fn: Callable[[], T], timeout: float = 5.0, what: str = "condition") -> T:
    """Poll ``fn`` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s (last: {value!r})")
        time.sleep(0.02)


def lookup(address: str, topic: str) -> Response:
    return http(address, "GET", f"/lookup?topic={topic}")


def producer_addresses(address: str, topic: str) -> list[str]:
    resp = lookup(address, topic)
    if resp.status != 200:
        return []
    return sorted(p["remote_address"] for p in resp.json()["producers"])


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def lookupd_pool(tmp_path: Path) -> Iterator[ServerPool]:
    pool = ServerPool(LOOKUPD, tmp_path)
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture(scope="module")
def lookupd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One nsqlookupd for the tests of this module that use their own names."""
    server = start_server(LOOKUPD, tmp_path_factory.mktemp("lookupd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clients(lookupd: ServerProcess) -> Iterator[Callable[..., LookupdClient]]:
    opened: list[LookupdClient] = []

    def connect(magic: bytes | None = b"  V1") -> LookupdClient:
        client = LookupdClient(lookupd.tcp_address, magic=magic)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    return "".join(c if c.isalnum() else "_" for c in request.node.name)[:50]


# -- process interface ------------------------------------------------------------------------


def test_version() -> None:
    result = run_once(LOOKUPD, ["--version"])
    assert result.returncode == 0
    assert result.stdout == "nsqlookupd v1.3.0 (built w/nsqpy-0.1.0)\n"


def test_bad_flag() -> None:
    result = run_once(LOOKUPD, ["--no-such-flag"])
    assert result.returncode == 1
    assert "flag provided but not defined: -no-such-flag" in result.stderr


def test_listen_failure(lookupd: ServerProcess) -> None:
    result = run_once(LOOKUPD, [f"--tcp-address={lookupd.tcp_address}"])
    assert result.returncode == 1
    assert "FATAL: failed to instantiate nsqlookupd" in result.stderr


def test_config_file(tmp_path: Path) -> None:
    config = tmp_path / "lookupd.toml"
    config.write_text(
        'broadcast_address = "from-config"\n'
        'tcp_address = "127.0.0.1:1"\n'  # the command line wins over the file
        'tombstone_lifetime = "2s"\n'
    )
    server = start_server(
        LOOKUPD,
        tmp_path,
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        defaults=False,
        options={"config": config},
    )
    try:
        client = LookupdClient(server.tcp_address)
        assert client.identify()["broadcast_address"] == "from-config"
        client.close()
    finally:
        server.stop()
    assert "nsqlookupd v1.3.0 (built w/nsqpy-0.1.0)" in server.log_lines[0]


# -- TCP protocol V1 --------------------------------------------------------------------------


def test_identify_reply(lookupd: ServerProcess, clients: Callable[..., LookupdClient]) -> None:
    client = clients()
    body = json.dumps(PEER).encode()
    raw = client.command(b"IDENTIFY\n" + int32(len(body)) + body)
    tcp_port = int(lookupd.tcp_address.rpartition(":")[2])
    http_port = int((lookupd.http_address or "").rpartition(":")[2])
    hostname = json.dumps(socket.gethostname())
    expected = (
        f'{{"broadcast_address":"127.0.0.1","hostname":{hostname},"http_port":{http_port},'
        f'"tcp_port":{tcp_port},"version":"1.3.0"}}'
    )
    assert raw == expected.encode()


def test_ping_before_and_after_identify(clients: Callable[..., LookupdClient]) -> None:
    client = clients()
    assert client.command(b"PING\n") == b"OK"
    client.identify()
    assert client.command(b"PING\n") == b"OK"
    # several commands in one write: replies in order
    client.send(b"REGISTER pipelined_t\nPING\nUNREGISTER pipelined_t\n")
    assert [client.read_reply() for _ in range(3)] == [b"OK", b"OK", b"OK"]


@pytest.mark.parametrize("magic", [b"  V2", b"V1  ", b"GET ", b"\x00\x00\x00\x00"])
def test_bad_magic(clients: Callable[..., LookupdClient], magic: bytes) -> None:
    client = clients(magic=None)
    client.send(magic + b"PING\n")
    assert client.read_all() == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"


BODY = json.dumps(PEER).encode()
IDENTIFY = b"IDENTIFY\n" + int32(len(BODY)) + BODY


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"FOO\n", "E_INVALID invalid command FOO"),
        (b"\n", "E_INVALID invalid command "),
        (b"register t\n", "E_INVALID invalid command register"),
        (b"REGISTER t\n", "E_INVALID client must IDENTIFY"),
        (b"UNREGISTER t c\n", "E_INVALID client must IDENTIFY"),
        (b"IDENTIFY\n" + int32(2) + b"{}", "E_BAD_BODY IDENTIFY missing fields"),
        (b"IDENTIFY\n" + int32(3) + b"{x}", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"IDENTIFY\n" + int32(0), "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"IDENTIFY\n" + int32(-1), "E_BAD_BODY IDENTIFY invalid body size -1"),
        (IDENTIFY + b"IDENTIFY\n", "E_INVALID cannot IDENTIFY again"),
        (IDENTIFY + b"REGISTER\n", "E_INVALID REGISTER insufficient number of params"),
        (IDENTIFY + b"UNREGISTER\n", "E_INVALID UNREGISTER insufficient number of params"),
        (IDENTIFY + b"REGISTER x:y\n", "E_BAD_TOPIC REGISTER topic name 'x:y' is not valid"),
        (
            IDENTIFY + b"UNREGISTER " + b"t" * 65 + b"\n",
            f"E_BAD_TOPIC UNREGISTER topic name '{'t' * 65}' is not valid",
        ),
        (IDENTIFY + b"REGISTER t c!\n", "E_BAD_CHANNEL REGISTER channel name 'c!' is not valid"),
        (
            IDENTIFY + b"UNREGISTER t c!\n",
            "E_BAD_CHANNEL UNREGISTER channel name 'c!' is not valid",
        ),
    ],
)
def test_errors_are_exact_and_fatal(
    clients: Callable[..., LookupdClient], data: bytes, error: str
) -> None:
    client = clients()
    client.send(data + b"PING\n")  # never answered: the error closes the connection
    if data.startswith(IDENTIFY):
        assert json.loads(client.read_reply())["version"] == "1.3.0"
    assert client.read_all() == reply(error)


def test_identify_cut_short(clients: Callable[..., LookupdClient]) -> None:
    client = clients()
    client.send(b"IDENTIFY\n" + int32(100) + b'{"version"')
    client.sock.shutdown(socket.SHUT_WR)
    assert client.read_all() == reply("E_BAD_BODY IDENTIFY failed to read body")
    client = clients()
    client.send(b"IDENTIFY\n\x00")
    client.sock.shutdown(socket.SHUT_WR)
    assert client.read_all() == reply("E_BAD_BODY IDENTIFY failed to read body size")


def test_registration_rules(
    lookupd: ServerProcess, clients: Callable[..., LookupdClient], name: str
) -> None:
    api = lookupd.http_address or ""
    nsqd = clients()
    nsqd.identify()
    nsqd.register(name, "c1")  # a channel registers its topic too
    nsqd.register(name, "c2")
    nsqd.register(name, "c#ephemeral")
    assert producer_addresses(api, name) == [nsqd.address]
    data = get_json(api, f"/lookup?topic={name}")
    assert sorted(data["channels"]) == ["c#ephemeral", "c1", "c2"]
    assert data["producers"] == [
        {
            "remote_address": nsqd.address,
            "hostname": "fake-nsqd",
            "broadcast_address": "10.1.2.3",
            "tcp_port": 4150,
            "http_port": 4151,
            "version": "1.3.0",
            "topology_zone": "",
            "topology_region": "",
        }
    ]
    assert list(json.loads(lookup(api, name).body)) == ["channels", "producers"]

    # UNREGISTER of a channel: the key stays, unless it is ephemeral
    nsqd.unregister(name, "c1")
    nsqd.unregister(name, "c#ephemeral")
    assert sorted(get_json(api, f"/channels?topic={name}")["channels"]) == ["c1", "c2"]
    debug = get_json(api, "/debug")
    assert f"channel:{name}:c1" not in debug  # no producers left: not listed
    assert [p["id"] for p in debug[f"channel:{name}:c2"]] == [nsqd.address]

    # UNREGISTER of a topic also leaves its channels (unexpected, but handled)
    nsqd.unregister(name)
    assert get_json(api, f"/lookup?topic={name}") == {"channels": ["c1", "c2"], "producers": []}
    assert f"channel:{name}:c2" not in get_json(api, "/debug")

    # an ephemeral topic key goes with its last producer
    other = clients()
    other.identify(broadcast_address="10.9.9.9")
    eph = f"{name}#ephemeral"
    nsqd.register(eph)
    other.register(eph, "c")
    nsqd.unregister(eph)
    assert lookup(api, eph).status == 200
    other.unregister(eph, "c")
    other.unregister(eph)
    assert lookup(api, eph).status == 404
    assert eph not in get_json(api, "/topics")["topics"]


def test_disconnect_removes_producer_keeps_keys(
    lookupd: ServerProcess, clients: Callable[..., LookupdClient], name: str
) -> None:
    api = lookupd.http_address or ""
    nsqd = clients()
    nsqd.identify()
    nsqd.register(name, "c")
    address = nsqd.address
    assert address in [n["remote_address"] for n in get_json(api, "/nodes")["producers"]]
    nsqd.close()
    wait_until(lambda: not producer_addresses(api, name), what="producer gone")
    assert get_json(api, f"/lookup?topic={name}") == {"channels": ["c"], "producers": []}
    assert name in get_json(api, "/topics")["topics"]
    assert address not in [n["remote_address"] for n in get_json(api, "/nodes")["producers"]]
    assert not [k for k, v in get_json(api, "/debug").items() if address in str(v)]


# -- HTTP -------------------------------------------------------------------------------------


def assert_v1(resp: Response, status: int, body: bytes) -> None:
    assert (resp.status, resp.body) == (status, body)
    assert resp.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"


def test_ping_and_info(lookupd: ServerProcess) -> None:
    api = lookupd.http_address or ""
    resp = http(api, "GET", "/ping")
    assert (resp.status, resp.body) == (200, b"OK")
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert "X-NSQ-Content-Type" not in resp.headers
    resp = http(api, "GET", "/info")
    assert_v1(resp, 200, b'{"version":"1.3.0"}')
    assert resp.headers["Content-Type"] == "application/json; charset=utf-8"


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=never_seen_topic", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/lookup?topic=", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/lookup?topic=%zz", 400, "INVALID_REQUEST"),
        ("GET", "/lookup?topic=a;b", 400, "INVALID_REQUEST"),
        ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create?topic=", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/create?topic=a/b", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/create?topic=abc%0A", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=a!", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/create?topic=a", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?topic=a&channel=b!", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/delete?topic=a!&channel=b", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/delete?topic=a", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=a&channel=", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=nope&channel=nope", 404, "CHANNEL_NOT_FOUND"),
        ("POST", "/topic/tombstone", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/tombstone?topic=a", 400, "MISSING_ARG_NODE"),
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("GET", "/topic", 404, "NOT_FOUND"),
        ("POST", "/lookup?topic=a", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/topic/create?topic=a", 405, "METHOD_NOT_ALLOWED"),
        ("PUT", "/ping", 405, "METHOD_NOT_ALLOWED"),
        # deprecated routes are gone (spec §4.3)
        ("GET", "/create_topic?topic=a", 404, "NOT_FOUND"),
        ("POST", "/delete_topic?topic=a", 404, "NOT_FOUND"),
        ("POST", "/tombstone_topic_producer?topic=a&node=b", 404, "NOT_FOUND"),
    ],
)
def test_http_errors(
    lookupd: ServerProcess, method: str, path: str, status: int, message: str
) -> None:
    resp = http(lookupd.http_address or "", method, path)
    assert_v1(resp, status, b'{"message":"%s"}' % message.encode())
    assert resp.headers["Content-Type"] == "application/json; charset=utf-8"


def test_method_not_allowed_allow_header(lookupd: ServerProcess) -> None:
    api = lookupd.http_address or ""
    assert http(api, "POST", "/lookup").headers["Allow"] == "GET, OPTIONS"
    assert http(api, "GET", "/topic/create").headers["Allow"] == "OPTIONS, POST"
    resp = http(api, "OPTIONS", "/nodes")
    assert (resp.status, resp.headers["Allow"], resp.body) == (200, "GET, OPTIONS", b"")
    resp = http(api, "GET", "/lookup/?topic=x")
    assert (resp.status, resp.headers["Location"]) == (301, "/lookup?topic=x")


def test_params_come_from_the_query_only(lookupd: ServerProcess) -> None:
    resp = http(lookupd.http_address or "", "POST", "/topic/create", body=b"topic=abc")
    assert_v1(resp, 400, b'{"message":"MISSING_ARG_TOPIC"}')


def test_topic_and_channel_admin(lookupd: ServerProcess, name: str) -> None:
    api = lookupd.http_address or ""
    resp = http(api, "POST", f"/topic/create?topic={name}")
    assert_v1(resp, 200, b"")
    assert name in get_json(api, "/topics")["topics"]
    assert get_json(api, f"/lookup?topic={name}") == {"channels": [], "producers": []}
    assert get_json(api, f"/channels?topic={name}") == {"channels": []}

    other = f"{name}_2"
    assert_v1(http(api, "POST", f"/channel/create?topic={other}&channel=c1"), 200, b"")
    assert_v1(http(api, "POST", f"/channel/create?topic={other}&channel=c2"), 200, b"")
    assert other in get_json(api, "/topics")["topics"]  # creating a channel adds the topic
    assert get_json(api, f"/channels?topic={other}") == {"channels": ["c1", "c2"]}

    assert_v1(http(api, "POST", f"/channel/delete?topic={other}&channel=c1"), 200, b"")
    assert get_json(api, f"/channels?topic={other}") == {"channels": ["c2"]}
    assert http(api, "POST", f"/channel/delete?topic={other}&channel=c1").status == 404

    assert_v1(http(api, "POST", f"/topic/delete?topic={other}"), 200, b"")
    assert other not in get_json(api, "/topics")["topics"]
    assert get_json(api, f"/channels?topic={other}") == {"channels": []}
    assert lookup(api, other).status == 404
    assert_v1(http(api, "POST", f"/topic/delete?topic={other}"), 200, b"")  # absent: fine


def test_nodes_and_debug(
    lookupd: ServerProcess, clients: Callable[..., LookupdClient], name: str
) -> None:
    api = lookupd.http_address or ""
    nsqd = clients()
    nsqd.identify(topology_zone="z1", topology_region="r1")
    nsqd.register(name)
    nsqd.register(f"{name}_b", "c")
    nodes = [n for n in get_json(api, "/nodes")["producers"] if n["remote_address"] == nsqd.address]
    assert len(nodes) == 1
    node = nodes[0]
    assert list(node) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "topology_zone",
        "topology_region",
        "tombstones",
        "topics",
    ]
    assert (node["topology_zone"], node["topology_region"]) == ("z1", "r1")
    assert sorted(node["topics"]) == [name, f"{name}_b"]
    assert node["tombstones"] == [False, False]

    debug = get_json(api, "/debug")
    assert list(debug) == sorted(debug)
    entry = next(e for e in debug[f"topic:{name}:"] if e["id"] == nsqd.address)
    assert list(entry) == sorted(entry)
    assert entry["tombstoned"] is False
    assert entry["tombstoned_at"] == -6795364578871345152  # Go's zero time
    assert abs(entry["last_update"] - time.time_ns()) < 60 * 10**9
    assert any(e["id"] == nsqd.address for e in debug["client::"])
    assert any(e["id"] == nsqd.address for e in debug[f"channel:{name}_b:c"])


# -- timeouts: tombstones and inactive producers ------------------------------------------------


def test_tombstone_hides_producer_for_its_lifetime(lookupd_pool: ServerPool, name: str) -> None:
    server = lookupd_pool.start(tombstone_lifetime="1s")
    api = server.http_address or ""
    a = LookupdClient(server.tcp_address)
    b = LookupdClient(server.tcp_address)
    a.identify(broadcast_address="10.0.0.1", http_port=4151)
    b.identify(broadcast_address="10.0.0.2", http_port=4151)
    for client in (a, b):
        client.register(name, "c")
        client.register(f"{name}_other")
    both = sorted([a.address, b.address])
    assert producer_addresses(api, name) == both

    resp = http(api, "POST", f"/topic/tombstone?topic={name}&node=10.0.0.1:4151")
    assert_v1(resp, 200, b"")
    tombstoned_at = time.monotonic()
    assert producer_addresses(api, name) == [b.address]
    assert producer_addresses(api, f"{name}_other") == both  # per topic only
    nodes = {n["remote_address"]: n for n in get_json(api, "/nodes")["producers"]}
    assert nodes[a.address]["tombstones"][nodes[a.address]["topics"].index(name)] is True
    assert nodes[b.address]["tombstones"] == [False, False]
    entry = next(e for e in get_json(api, "/debug")[f"topic:{name}:"] if e["id"] == a.address)
    assert entry["tombstoned"] is True

    # a new REGISTER does not clear it: it expires
    a.register(name)
    assert producer_addresses(api, name) == [b.address]
    wait_until(lambda: producer_addresses(api, name) == both, timeout=5, what="tombstone expiry")
    assert time.monotonic() - tombstoned_at >= 0.9
    nodes = {n["remote_address"]: n for n in get_json(api, "/nodes")["producers"]}
    assert nodes[a.address]["tombstones"] == [False, False]
    a.close()
    b.close()


def test_inactive_producer_timeout(lookupd_pool: ServerPool, name: str) -> None:
    server = lookupd_pool.start(inactive_producer_timeout="1s")
    api = server.http_address or ""
    nsqd = LookupdClient(server.tcp_address)
    nsqd.identify()
    nsqd.register(name)
    assert producer_addresses(api, name) == [nsqd.address]
    # REGISTER does not refresh the producer, only IDENTIFY and PING do
    wait_until(lambda: not producer_addresses(api, name), timeout=5, what="inactive")
    assert get_json(api, "/nodes")["producers"] == []
    nsqd.register(f"{name}_2")
    assert not producer_addresses(api, name)
    assert nsqd.command(b"PING\n") == b"OK"
    assert producer_addresses(api, name) == [nsqd.address]
    assert len(get_json(api, "/nodes")["producers"]) == 1
    nsqd.close()
