#!/usr/bin/env python3
"""An HTTP load generator for ``bench_http.sh`` where wrk is not installed.

Like ``wrk -t<threads> -c<connections> -d<duration> --latency`` with a POST body: each of
``--connections`` keep-alive HTTP/1.1 connections sends the same request again and again,
one at a time, for ``--duration``, split over ``--threads`` processes. It prints wrk's
summary lines (``Latency``, the percentiles, ``N requests in Xs``, ``Non-2xx or 3xx
responses``, ``Requests/sec:``), which ``bench_http.sh`` reads.

Python is slower than wrk: on a fast nsqd the figures are this tool's ceiling, not the
server's. Install wrk for real runs (``apt-get install -y wrk``). Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import re
import statistics
import sys
import time
from urllib.parse import urlsplit

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}


def parse_duration(text: str) -> float:
    """wrk's ``-d``: ``10s``, ``2m``, ``1h``; also ``500ms``; a bare number is seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


async def _one_connection(
    host: str, port: int, request: bytes, end: float, latencies: list[float], stats: list[int]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    clock = time.perf_counter
    try:
        while clock() < end:
            t0 = clock()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            latencies.append(clock() - t0)
            status = head[9:12]
            stats[0] += 1
            stats[1] += len(head) + len(body)
            if not status.startswith((b"2", b"3")):
                stats[2] += 1
    finally:
        writer.close()


def _run(
    host: str, port: int, request: bytes, connections: int, end: float
) -> tuple[list[float], list[int]]:
    latencies: list[float] = []
    stats = [0, 0, 0]  # requests, bytes read, non-2xx/3xx

    async def main() -> None:
        await asyncio.gather(
            *(
                _one_connection(host, port, request, end, latencies, stats)
                for _ in range(connections)
            )
        )

    asyncio.run(main())
    return latencies, stats


def _worker(
    host: str, port: int, request: bytes, connections: int, end: float, out: mp.Queue[object]
) -> None:
    try:
        out.put(_run(host, port, request, connections, end))
    except BaseException as exc:
        out.put(exc)


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f}us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f}ms"
    return f"{seconds:.2f}s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.2f}{unit}"
        n /= 1024
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-t", "--threads", type=int, default=1, help="processes")
    p.add_argument("-c", "--connections", type=int, default=10)
    p.add_argument("-d", "--duration", type=parse_duration, default=10.0)
    p.add_argument("--body-file", required=True, help="the POST body")
    p.add_argument("url")
    args = p.parse_args(argv)
    url = urlsplit(args.url)
    if url.scheme != "http" or not url.hostname or not url.port:
        p.error(f"want http://host:port/path, not {args.url!r}")
    threads = max(1, min(args.threads, args.connections))
    with open(args.body_file, "rb") as f:
        body = f.read()
    target = url.path + (f"?{url.query}" if url.query else "")
    request = (
        f"POST {target} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    print(f"Running {args.duration:g}s test @ {args.url} (bench/_http_load.py, wrk not found)")
    print(f"  {threads} threads and {args.connections} connections")
    start = time.perf_counter()
    end = start + args.duration
    shares = [
        args.connections // threads + (i < args.connections % threads) for i in range(threads)
    ]
    ctx = mp.get_context("fork")
    out: mp.Queue[object] = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url.hostname, url.port, request, n, end, out))
        for n in shares
    ]
    for proc in procs:
        proc.start()
    latencies: list[float] = []
    totals = [0, 0, 0]
    try:
        for _ in procs:
            got = out.get(timeout=args.duration + 60)
            if isinstance(got, BaseException):
                print(f"load generator failed: {got!r}", file=sys.stderr)
                return 1
            lat, stats = got  # type: ignore[misc]
            latencies += lat
            totals = [a + b for a, b in zip(totals, stats, strict=True)]
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    took = time.perf_counter() - start
    requests, nbytes, bad = totals
    if not requests:
        print("no request was answered", file=sys.stderr)
        return 1
    latencies.sort()
    mean = statistics.fmean(latencies)
    stdev = statistics.pstdev(latencies)
    within = sum(1 for x in latencies if abs(x - mean) <= stdev) / len(latencies)
    print("  Thread Stats   Avg      Stdev     Max   +/- Stdev")
    print(
        f"    Latency   {fmt_time(mean):>8} {fmt_time(stdev):>8} {fmt_time(latencies[-1]):>8}"
        f" {100 * within:>7.2f}%"
    )
    print("  Latency Distribution")
    for pct in (50, 75, 90, 99):
        value = latencies[min(len(latencies) - 1, len(latencies) * pct // 100)]
        print(f"     {pct}% {fmt_time(value):>8}")
    print(f"  {requests} requests in {took:.2f}s, {fmt_bytes(nbytes)} read")
    if bad:
        print(f"  Non-2xx or 3xx responses: {bad}")
    print(f"Requests/sec: {requests / took:10.2f}")
    print(f"Transfer/sec: {fmt_bytes(nbytes / took):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
