"""nsqpy.client._conn: frame parsing, pipelined replies, batched writes, the handshake."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from nsqpy.client import Message, NSQConnectionError, NSQError
from nsqpy.client._config import Config, ConsumerOptions, resolve
from nsqpy.client._conn import Conn, split_address
from nsqpy.wire.compression import (
    DeflateStreamDecoder,
    DeflateStreamEncoder,
    SnappyStreamDecoder,
    SnappyStreamEncoder,
)
from nsqpy.wire.v2 import (
    FRAME_HEARTBEAT,
    FRAME_OK,
    MAGIC_V2,
    encode_error,
    encode_message_frame,
    encode_response,
)

T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class FakeTransport:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.conn.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed


class Delegate:
    def __init__(self, on_batch: Callable[[list[Message]], None] | None = None) -> None:
        self.batches: list[list[Message]] = []
        self.responses: list[tuple[bytes, bool, bool]] = []
        self.closed: list[BaseException | None] = []
        self.on_batch = on_batch

    def on_messages(self, conn: Conn, messages: list[Message]) -> None:
        self.batches.append(messages)
        if self.on_batch:
            self.on_batch(messages)

    def on_response(self, conn: Conn, msg: Message, finished: bool, backoff: bool) -> None:
        self.responses.append((msg.id, finished, backoff))

    def on_finished(self, conn: Conn, count: int) -> None:
        self.responses.extend([(b"", True, False)] * count)

    def on_close(self, conn: Conn, exc: BaseException | None) -> None:
        self.closed.append(exc)


def connected(delegate: Delegate, **options: Any) -> tuple[Conn, FakeTransport]:
    """A Conn past its handshake, on a fake transport (call inside a running loop)."""
    conn = Conn("127.0.0.1:4150", resolve(options, ConsumerOptions), delegate)
    conn._loop = asyncio.get_running_loop()
    conn._thread_id = threading.get_ident()
    transport = FakeTransport(conn)
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.established = True
    return conn, transport


def message_frame(n: int, body: bytes = b"", attempts: int = 1) -> bytes:
    return encode_message_frame(b"%016d" % n, 1_700_000_000_000_000_000 + n, attempts, body)


def test_split_address() -> None:
    assert split_address("127.0.0.1:4150") == ("127.0.0.1", 4150)
    assert split_address("[::1]:4150") == ("::1", 4150)
    for bad in ("localhost", ":4150", "host:", "host:x"):
        with pytest.raises(ValueError):
            split_address(bad)


def test_messages_one_byte_at_a_time() -> None:
    async def main() -> None:
        delegate = Delegate()
        conn, _ = connected(delegate)
        data = b"".join(message_frame(n, b"body %d" % n) for n in range(5))
        for i in range(len(data)):
            conn.data_received(data[i : i + 1])
        msgs = [m for batch in delegate.batches for m in batch]
        assert [m.body for m in msgs] == [b"body %d" % n for n in range(5)]
        assert [m.id for m in msgs] == [b"%016d" % n for n in range(5)]
        assert msgs[3].timestamp == 1_700_000_000_000_000_003
        assert msgs[0].attempts == 1 and msgs[0].nsqd_address == "127.0.0.1:4150"
        assert conn.in_flight == 5

    arun(main())


def test_one_read_is_one_batch_and_a_big_message_across_reads() -> None:
    async def main() -> None:
        delegate = Delegate()
        conn, _ = connected(delegate)
        conn.data_received(b"".join(message_frame(n) for n in range(100)))
        assert [len(b) for b in delegate.batches] == [100]
        big = message_frame(7, b"x" * 1_000_000)
        for i in range(0, len(big), 65536):
            conn.data_received(big[i : i + 65536])
        assert [len(b) for b in delegate.batches] == [100, 1]
        assert delegate.batches[1][0].body == b"x" * 1_000_000

    arun(main())


def test_heartbeat_answered_with_nop() -> None:
    async def main() -> None:
        conn, transport = connected(Delegate())
        conn.data_received(FRAME_HEARTBEAT + FRAME_HEARTBEAT[:5])
        conn.data_received(FRAME_HEARTBEAT[5:])
        assert transport.writes == [b"NOP\n", b"NOP\n"]

    arun(main())


def test_fins_of_one_read_go_out_in_one_write() -> None:
    async def main() -> None:
        def finish_all(messages: list[Message]) -> None:
            for m in messages:
                m.finish()

        delegate = Delegate(finish_all)
        conn, transport = connected(delegate)
        conn.data_received(b"".join(message_frame(n) for n in range(50)) + FRAME_HEARTBEAT)
        assert len(transport.writes) == 1
        expected = b"".join(b"FIN %016d\n" % n for n in range(50)) + b"NOP\n"
        assert transport.writes[0] == expected
        assert conn.in_flight == 0
        assert len(delegate.responses) == 50 and all(r[1] for r in delegate.responses)

    arun(main())


def test_finish_all_skips_responded_and_manual_messages() -> None:
    async def main() -> None:
        delegate = Delegate()
        conn, transport = connected(delegate)
        conn.data_received(b"".join(message_frame(n) for n in range(4)))
        msgs = delegate.batches[0]
        msgs[1].requeue(0)
        msgs[2].disable_auto_response()
        conn.finish_all(msgs)
        await asyncio.sleep(0)
        assert transport.writes == [b"REQ %016d 0\n" % 1 + b"FIN %016d\nFIN %016d\n" % (0, 3)]
        assert conn.in_flight == 1 and not msgs[2].has_responded

    arun(main())


def test_writes_outside_a_read_are_coalesced_per_loop_turn() -> None:
    async def main() -> None:
        delegate = Delegate()
        conn, transport = connected(delegate, default_requeue_delay=2, max_requeue_delay=5)
        conn.data_received(b"".join(message_frame(n, attempts=n + 1) for n in range(4)))
        msgs = delegate.batches[0]
        msgs[0].finish()
        msgs[0].finish()  # a second response is ignored
        msgs[1].requeue()  # default delay: 2 s x 2 attempts
        msgs[2].requeue(backoff=False)  # 2 s x 3 = 6 s, capped at 5 s
        msgs[3].touch()
        msgs[3].requeue(0.25)
        assert transport.writes == []
        await asyncio.sleep(0)
        assert transport.writes == [
            b"FIN %016d\n" % 0
            + b"REQ %016d 4000\n" % 1
            + b"REQ %016d 5000\n" % 2
            + b"TOUCH %016d\n" % 3
            + b"REQ %016d 250\n" % 3
        ]
        assert [r[1:] for r in delegate.responses] == [
            (True, False),
            (False, True),
            (False, False),
            (False, True),
        ]
        assert all(m.has_responded for m in msgs)

    arun(main())


def test_respond_from_another_thread() -> None:
    async def main() -> None:
        delegate = Delegate()
        conn, transport = connected(delegate)
        conn.data_received(message_frame(1))
        msg = delegate.batches[0][0]
        thread = threading.Thread(target=msg.finish)
        thread.start()
        await asyncio.to_thread(thread.join)
        for _ in range(3):
            await asyncio.sleep(0)
        assert transport.writes == [b"FIN %016d\n" % 1]
        assert conn.in_flight == 0

    arun(main())


def test_pipelined_replies_in_order_and_a_fatal_error() -> None:
    async def main() -> None:
        delegate = Delegate()
        conn, transport = connected(delegate)
        futures = [conn.command(b"PUB t\n\x00\x00\x00\x01x") for _ in range(4)]
        await asyncio.sleep(0)
        assert len(transport.writes) == 1  # four commands, one write
        conn.data_received(FRAME_OK + FRAME_HEARTBEAT + FRAME_OK)
        assert [f.done() for f in futures] == [True, True, False, False]
        # non-fatal errors answer FIN/REQ/TOUCH, which have no reply: nothing settles
        conn.data_received(
            encode_error("E_FIN_FAILED FIN 0000000000000001 failed ID not in flight")
        )
        assert not futures[2].done()
        conn.data_received(encode_error("E_BAD_MESSAGE PUB invalid message body size 0"))
        err = futures[2].exception()
        assert isinstance(err, NSQError)
        assert err.code == "E_BAD_MESSAGE" and err.fatal
        assert err.desc == "PUB invalid message body size 0"
        assert conn.failed and transport.closed
        await asyncio.sleep(0)
        assert conn.closed
        with pytest.raises(NSQConnectionError):
            await futures[3]
        assert len(delegate.closed) == 1 and isinstance(delegate.closed[0], NSQError)

    arun(main())


def test_lost_connection_fails_pending_commands() -> None:
    async def main() -> None:
        delegate = Delegate()
        conn, _ = connected(delegate)
        fut = conn.command(b"PUB t\n\x00\x00\x00\x01x")
        conn.connection_lost(ConnectionResetError("reset by peer"))
        with pytest.raises(NSQConnectionError, match="reset by peer"):
            await fut
        with pytest.raises(NSQConnectionError):
            conn.command(b"NOP\n")
        assert delegate.closed and isinstance(delegate.closed[0], ConnectionResetError)

    arun(main())


def test_identify_body_is_go_nsq_like() -> None:
    config = resolve(
        {"heartbeat_interval": -1, "msg_timeout": 2.5, "snappy": True}, ConsumerOptions
    )
    body = config.identify_body()
    assert body["feature_negotiation"] is True
    assert body["heartbeat_interval"] == -1
    assert body["msg_timeout"] == 2500
    assert body["output_buffer_timeout"] == 250
    assert body["snappy"] is True and body["deflate"] is False
    assert body["client_id"] and body["hostname"]
    assert Config().user_agent.startswith("nsqpy/")


# -- the handshake, against a fake nsqd in this process ---------------------------------


async def fake_nsqd(
    reply: dict[str, Any], *, codec: str | None = None, auth: bool = False
) -> tuple[asyncio.Server, list[bytes], str]:
    """An nsqd stand-in that answers IDENTIFY with ``reply`` and then the upgrade's OK in
    the same write (the case a client must not misread), then OK to every PUB."""
    received: list[bytes] = []

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(4) == MAGIC_V2
        line = await reader.readline()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        received.append(line + await reader.readexactly(size))
        first = encode_response(json.dumps(reply).encode())
        encode: Callable[[bytes], bytes] = bytes
        decode: Callable[[bytes], bytes] = bytes
        if codec == "snappy":
            encode, decode = SnappyStreamEncoder().encode, SnappyStreamDecoder().decode
        elif codec == "deflate":
            encode, decode = DeflateStreamEncoder(6).encode, DeflateStreamDecoder().decode
        writer.write(first + (encode(FRAME_OK) if codec else b""))
        buf = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            buf += decode(chunk) if codec else chunk
            while b"\n" in buf:
                line, _, rest = buf.partition(b"\n")
                if line in (b"PUB t", b"AUTH"):
                    if len(rest) < 4:
                        break
                    (n,) = struct.unpack(">i", rest[:4])
                    if len(rest) < 4 + n:
                        break
                    received.append(line + b" " + rest[4 : 4 + n])
                    buf = rest[4 + n :]
                    if line == b"AUTH":
                        out = encode_response(b'{"identity":"me","permission_count":1}')
                    else:
                        out = FRAME_OK
                    writer.write(encode(out) if codec else out)
                else:
                    received.append(line)
                    buf = rest
        writer.close()

    server = await asyncio.start_server(session, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, received, f"127.0.0.1:{port}"


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_handshake_upgrade_ok_in_the_same_read(codec: str) -> None:
    async def main() -> None:
        reply = {"max_rdy_count": 42, codec: True, "deflate_level": 6, "auth_required": False}
        server, received, address = await fake_nsqd(reply, codec=codec)
        async with server:
            conn = Conn(address, resolve({codec: True}, ConsumerOptions), Delegate())
            await conn.connect()
            assert conn.negotiated[codec] is True
            assert conn.max_rdy == 42
            assert await conn.command(b"PUB t\n\x00\x00\x00\x05hello") == b"OK"
            conn.close()
            await conn.wait_closed()
        identify = json.loads(received[0].partition(b"\n")[2][:])
        assert identify[codec] is True
        assert received[1] == b"PUB t hello"

    arun(main())


def test_handshake_auth() -> None:
    async def main() -> None:
        server, received, address = await fake_nsqd({"auth_required": True})
        async with server:
            conn = Conn(address, resolve({"auth_secret": "s3cret"}, ConsumerOptions), Delegate())
            await conn.connect()
            assert conn.auth == {"identity": "me", "permission_count": 1}
            conn.close()
            without = Conn(address, resolve({}, ConsumerOptions), Delegate())
            with pytest.raises(Exception, match="requires AUTH"):
                await without.connect()
        assert b"AUTH s3cret" in received

    arun(main())
