#!/usr/bin/env python3
"""PUB and SUB figures with TLS, snappy and deflate against plain connections.

bench_writer/bench_reader speak the plain protocol only, so this runner has its own small
load generators: raw sockets, Python's ssl, and nsqpy's stream codecs. It starts one
fresh nsqd with a throw-away certificate (trustme), then for each mode

    plain  tls  snappy  deflate  tls+snappy  tls+deflate

publishes for --runfor with N writer processes (MPUB batches of --batch-size messages of
--size bytes, waiting for each OK) into a topic of its own whose channel exists, then
consumes that backlog for up to --runfor with N reader processes (RDY --rdy, FIN every
message), sampling nsqd's CPU time around each phase as run_bench.py does.

    uv run python bench/bench_features.py --runfor 3s
    uv run python bench/bench_features.py --runfor 3s --modes plain,snappy --workers 1

Writers send pre-encoded bytes: a TLS record stream is encrypted per send, but a snappy
MPUB is the same chunks every time (chunks are independent), and a deflate MPUB compressed
after a full flush (``Z_FULL_FLUSH``: byte-aligned, no back-references) is the same bytes
every time, so the writers' CPU stays low and nsqd is the one doing the per-byte work.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import ssl
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import cramjam  # noqa: E402
import run_bench  # noqa: E402  (nsqd process, CPU sampling, Go durations)

from nsqpy.wire.compression import (  # noqa: E402
    SNAPPY_STREAM_IDENTIFIER,
    DeflateStreamDecoder,
    SnappyStreamDecoder,
)

MODES = ("plain", "tls", "snappy", "deflate", "tls+snappy", "tls+deflate")
MAGIC = b"  V2"
_FRAME = struct.Struct(">ii")
_SIZE = struct.Struct(">i")
DEFLATE_LEVEL = 6


# -- one connection with the negotiated layers ---------------------------------------------


class Conn:
    def __init__(self, address: str, mode: str, ca_path: str, **identify: Any) -> None:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.mode = mode
        self.tls = "tls" in mode
        self.snappy = "snappy" in mode
        self.deflate = "deflate" in mode
        body = {
            "feature_negotiation": True,
            "tls_v1": self.tls,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": DEFLATE_LEVEL,
            "user_agent": "bench_features",
            **identify,
        }
        payload = json.dumps(body).encode()
        sock.sendall(MAGIC + b"IDENTIFY\n" + _SIZE.pack(len(payload)) + payload)
        self.sock: socket.socket = sock
        frame_type, reply = self._read_clear_frame()
        if frame_type != 0:
            raise RuntimeError(f"IDENTIFY failed: {reply!r}")
        negotiated = json.loads(reply)
        for feature in ("tls_v1", "snappy", "deflate"):
            wanted = {"tls_v1": self.tls, "snappy": self.snappy, "deflate": self.deflate}[feature]
            if negotiated[feature] != wanted:
                raise RuntimeError(f"{feature} not negotiated: {negotiated}")
        if self.tls:
            ctx = ssl.create_default_context(cafile=ca_path)
            self.sock = ctx.wrap_socket(sock, server_hostname=host)
            assert self._read_clear_frame() == (0, b"OK")
        self._decode: Callable[[bytes], bytes] | None = None
        self._snappy_started = False
        self._deflater = zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -15)
        if self.snappy:
            self._decode = SnappyStreamDecoder().decode
        elif self.deflate:
            self._decode = DeflateStreamDecoder().decode
        self._buf = b""
        if self._decode is not None:
            assert self.read_frames(1)[0] == (0, b"OK")

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("nsqd closed the connection")
            buf += chunk
        return buf

    def _read_clear_frame(self) -> tuple[int, bytes]:
        size, frame_type = _FRAME.unpack(self._recv_exact(8))
        return frame_type, self._recv_exact(size - 4)

    # writes

    def pre_encode(self, data: bytes) -> bytes:
        """What to send, again and again, for ``data`` (see the module docstring)."""
        if self.snappy:
            return bytes(cramjam.snappy.compress(data))[len(SNAPPY_STREAM_IDENTIFIER) :]
        if self.deflate:
            deflater = zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -15)
            return deflater.compress(data) + deflater.flush(zlib.Z_FULL_FLUSH)
        return data

    def send_encoded(self, data: bytes) -> None:
        if self.snappy and not self._snappy_started:
            self._snappy_started = True
            data = SNAPPY_STREAM_IDENTIFIER + data
        self.sock.sendall(data)

    def send(self, data: bytes) -> None:
        if self.snappy:
            self.send_encoded(bytes(cramjam.snappy.compress(data))[len(SNAPPY_STREAM_IDENTIFIER) :])
        elif self.deflate:
            self.sock.sendall(
                self._deflater.compress(data) + self._deflater.flush(zlib.Z_SYNC_FLUSH)
            )
        else:
            self.sock.sendall(data)

    # reads

    def recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        return self._decode(data) if self._decode is not None else data

    def read_frames(self, at_least: int = 1) -> list[tuple[int, bytes]]:
        frames: list[tuple[int, bytes]] = []
        while len(frames) < at_least:
            buf = self._buf + self.recv()
            pos = 0
            n = len(buf)
            while n - pos >= 8:
                size, frame_type = _FRAME.unpack_from(buf, pos)
                end = pos + 4 + size
                if end > n:
                    break
                frames.append((frame_type, buf[pos + 8 : end]))
                pos = end
            self._buf = buf[pos:]
        return frames


# -- workers ---------------------------------------------------------------------------------


def mpub_command(topic: str, size: int, batch: int, random_bodies: bool) -> bytes:
    """Zero bodies like Go's bench_writer (very compressible), or random incompressible ones."""
    bodies = [os.urandom(size) if random_bodies else bytes(size) for _ in range(batch)]
    payload = _SIZE.pack(batch) + b"".join(_SIZE.pack(size) + body for body in bodies)
    return b"MPUB " + topic.encode() + b"\n" + _SIZE.pack(len(payload)) + payload


def writer(
    address: str,
    mode: str,
    ca: str,
    topic: str,
    size: int,
    batch: int,
    random_bodies: bool,
    start: float,
    end: float,
    out: Any,
) -> None:
    conn = Conn(address, mode, ca)
    pre = conn.pre_encode(mpub_command(topic, size, batch, random_bodies))
    count = 0
    time.sleep(max(0.0, start - time.time()))
    cpu0 = time.process_time()
    while time.time() < end:
        conn.send_encoded(pre)
        for frame_type, data in conn.read_frames(1):
            if frame_type == 1:
                raise RuntimeError(data.decode(errors="replace"))
        count += batch
    out.put((count, time.process_time() - cpu0))


def reader(
    address: str,
    mode: str,
    ca: str,
    topic: str,
    channel: str,
    rdy: int,
    start: float,
    end: float,
    out: Any,
) -> None:
    conn = Conn(address, mode, ca, output_buffer_timeout=25)
    conn.send(b"SUB " + topic.encode() + b" " + channel.encode() + b"\n")
    assert conn.read_frames(1)[0] == (0, b"OK")
    time.sleep(max(0.0, start - time.time()))
    conn.send(b"RDY %d\n" % rdy)
    cpu0 = time.process_time()
    count = 0
    last = time.time()
    conn.sock.settimeout(0.5)
    while time.time() < end:
        try:
            frames = conn.read_frames(1)
        except TimeoutError:
            if time.time() - last > 1.0:
                break  # the backlog is drained
            continue
        fins = []
        for frame_type, data in frames:
            if frame_type == 2:
                fins.append(b"FIN " + data[10:26] + b"\n")
            elif frame_type == 0 and data == b"_heartbeat_":
                fins.append(b"NOP\n")
            elif frame_type == 1:
                raise RuntimeError(data.decode(errors="replace"))
        if fins:
            count += len(fins)
            conn.send(b"".join(fins))
            last = time.time()
    out.put((count, time.process_time() - cpu0, last))


# -- the runner ------------------------------------------------------------------------------


@dataclass
class Result:
    mode: str
    phase: str
    msgs: int
    seconds: float
    server_cpu: float
    client_cpu: float

    @property
    def rate(self) -> float:
        return self.msgs / self.seconds if self.seconds else 0.0

    @property
    def server_us(self) -> float:
        return self.server_cpu / self.msgs * 1e6 if self.msgs else float("nan")


def run_phase(
    nsqd: run_bench.Nsqd,
    target: Callable[..., None],
    args: tuple[Any, ...],
    workers: int,
    runfor: float,
    lead: float = 1.0,
) -> tuple[int, float, float, float]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = time.time() + lead  # connections made first
    end = start + runfor
    procs = [ctx.Process(target=target, args=(*args, start, end, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start - time.time()))
    cpu0 = run_bench.cpu_seconds(nsqd.pid)
    results = [out.get(timeout=runfor + 60) for _ in procs]
    cpu1 = run_bench.cpu_seconds(nsqd.pid)
    for p in procs:
        p.join(10)
        if p.exitcode:
            raise run_bench.BenchError(f"a worker failed ({p.exitcode})\n" + nsqd.log_tail())
    msgs = sum(r[0] for r in results)
    client = sum(r[1] for r in results)
    last = max((r[2] for r in results if len(r) > 2), default=end)
    seconds = min(end, max(last, start + 0.001)) - start
    return msgs, seconds, cpu1 - cpu0, client


def make_certs(path: Path) -> tuple[str, str, str]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(path / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(path / "key.pem"))
    return str(path / "ca.pem"), str(path / "cert.pem"), str(path / "key.pem")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runfor", default="3s", help="duration of each phase (Go duration)")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--rdy", type=int, default=2500)
    p.add_argument("--mem-queue-size", type=int, default=5_000_000)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument(
        "--random-bodies",
        action="store_true",
        help="incompressible message bodies (default: zeros, as Go's bench_writer)",
    )
    p.add_argument("--nsqd-bin", default=run_bench.default_nsqd())
    p.add_argument(
        "--lead",
        default="1s",
        help="time the workers get to connect before each phase starts (Go duration)",
    )
    args = p.parse_args(argv)
    runfor = run_bench.parse_go_duration_s(args.runfor)
    lead = run_bench.parse_go_duration_s(args.lead)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            p.error(f"unknown mode {mode!r} (valid: {', '.join(MODES)})")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bench-features-") as tmp:
        ca, cert, key = make_certs(Path(tmp))
        data = Path(tmp) / "data"
        data.mkdir()
        argv_nsqd = [
            *args.nsqd_bin.split(),
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--https-address=",
            f"--mem-queue-size={args.mem_queue_size}",
            f"--data-path={data}",
            f"--tls-cert={cert}",
            f"--tls-key={key}",
            f"--max-rdy-count={max(2500, args.rdy)}",
        ]
        nsqd = run_bench.Nsqd(argv_nsqd)
        nsqd.start()
        try:
            print(f"nsqd pid {nsqd.pid} listening on {nsqd.tcp_address}", flush=True)
            for mode in modes:
                topic = "bench_" + mode.replace("+", "_")
                run_bench.create_channel(nsqd.tcp_host, nsqd.tcp_port, topic, "ch")
                for phase, target, extra in (
                    ("PUB", writer, (topic, args.size, args.batch_size, args.random_bodies)),
                    ("SUB", reader, (topic, "ch", args.rdy)),
                ):
                    msgs, seconds, server_cpu, client_cpu = run_phase(
                        nsqd,
                        target,
                        (nsqd.tcp_address, mode, ca, *extra),
                        args.workers,
                        runfor,
                        lead,
                    )
                    result = Result(mode, phase, msgs, seconds, server_cpu, client_cpu)
                    results.append(result)
                    print(
                        f"{mode:12s} {phase}: {result.rate:12,.0f} msgs/s  server "
                        f"{result.server_us:6.2f} us/msg  client {client_cpu / max(msgs, 1) * 1e6:5.2f} us/msg",
                        flush=True,
                    )
                    nsqd.check_alive()
        finally:
            nsqd.stop()
    print("\n==== features summary ====")
    bodies = "random" if args.random_bodies else "zeros"
    print(
        f"settings: size={args.size} batch-size={args.batch_size} runfor={args.runfor} "
        f"workers={args.workers} rdy={args.rdy} deflate-level={DEFLATE_LEVEL} bodies={bodies}"
    )
    print(
        f"{'mode':12s} {'PUB msgs/s':>12s} {'PUB us/msg':>11s} {'SUB msgs/s':>12s} {'SUB us/msg':>11s}"
    )
    for mode in modes:
        pub = next(r for r in results if r.mode == mode and r.phase == "PUB")
        sub = next(r for r in results if r.mode == mode and r.phase == "SUB")
        print(
            f"{mode:12s} {pub.rate:12,.0f} {pub.server_us:11.2f} {sub.rate:12,.0f} {sub.server_us:11.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
