#!/usr/bin/env python3
"""Disk queue throughput: puts/s and reads/s of 200-byte records, on one core.

Drives :class:`nsqpy.diskqueue.DiskQueue` the way the engine does in ``--mem-queue-size=0``
mode: operations in batches, and after each batch ``needs_sync()`` -> ``begin_sync()`` on this
thread with the fsync + metadata part (:meth:`SyncJob.run`) in a worker thread, at most one
in flight (``--sync inline`` runs it on this thread instead, ``--sync none`` never syncs).

    cd /work/main && UV_PYTHON_DOWNLOADS=never uv run python bench/bench_diskqueue.py

Scenarios, each on a fresh queue:

* ``put``         one ``put()`` per record
* ``put_many``    ``put_many()`` of ``--batch`` records (MPUB)
* ``read``        one ``read()`` per record, from the files ``put`` left (page cache)
* ``read_many``   ``read_many(--batch)`` from the files ``put_many`` left
* ``pass``        ``put()`` x batch then ``read_many(batch)``: the reader keeps up with the
                  writer, as a channel with consumers does with --mem-queue-size=0
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from nsqpy.diskqueue import DiskQueue


class Syncer:
    """The engine's maybe_sync: one SyncJob in flight in a worker thread."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.pool = ThreadPoolExecutor(max_workers=1) if mode == "thread" else None
        self.pending: Future[None] | None = None
        self.jobs = 0

    def maybe_sync(self, dq: DiskQueue) -> None:
        if self.mode == "none" or not dq.needs_sync():
            return
        if self.pool is None:
            dq.sync()
            self.jobs += 1
            return
        if self.pending is not None:
            if not self.pending.done():
                return  # coalesce: the next batch will ask again
            self.pending.result()
        self.pending = self.pool.submit(dq.begin_sync().run)
        self.jobs += 1

    def finish(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None
        if self.pool is not None:
            self.pool.shutdown()


def nolog(level: int, msg: str) -> None:
    pass


def run(
    label: str,
    args: argparse.Namespace,
    path: str,
    name: str,
    body: Callable[[DiskQueue, Syncer], int],
) -> None:
    dq = DiskQueue(
        name,
        path,
        args.max_bytes_per_file,
        26,
        args.size + 1024,
        args.sync_every,
        2.0,
        nolog,
    )
    syncer = Syncer(args.sync)
    cpu0, t0 = time.process_time(), time.perf_counter()
    n = body(dq, syncer)
    t1 = time.perf_counter()
    syncer.finish()
    dq.close()
    t2 = time.perf_counter()
    cpu = time.process_time() - cpu0
    print(
        f"{label:<10} {n:>10,} x {args.size} B  {t1 - t0:7.3f} s  {n / (t1 - t0):>12,.0f} ops/s"
        f"  {n * (args.size + 4) / (t1 - t0) / 1e6:7.1f} MB/s   (+close {t2 - t1:.3f} s,"
        f" cpu {cpu:.3f} s, syncs {syncer.jobs})",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200, help="record payload bytes")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--sync-every", type=int, default=2500)
    ap.add_argument("--max-bytes-per-file", type=int, default=100 * 1024 * 1024)
    ap.add_argument("--sync", choices=["thread", "inline", "none"], default="thread")
    ap.add_argument("--dir", default=None, help="data directory (default: a temp dir)")
    args = ap.parse_args()

    base = tempfile.mkdtemp(prefix="bench_dq_", dir=args.dir)
    count: int = args.count
    batch: int = args.batch
    payload = bytes(range(256)) * (args.size // 256 + 1)
    payload = payload[: args.size]
    print(
        f"# python {sys.version.split()[0]}, dir {base}, sync={args.sync} every {args.sync_every},"
        f" max-bytes-per-file {args.max_bytes_per_file}, batch {batch}",
        flush=True,
    )
    try:

        def do_put(dq: DiskQueue, s: Syncer) -> int:
            put = dq.put
            for _ in range(count // batch):
                for _ in range(batch):
                    put(payload)
                s.maybe_sync(dq)
            return count // batch * batch

        def do_put_many(dq: DiskQueue, s: Syncer) -> int:
            chunk = [payload] * batch
            for _ in range(count // batch):
                dq.put_many(chunk)
                s.maybe_sync(dq)
            return count // batch * batch

        def do_read(dq: DiskQueue, s: Syncer) -> int:
            read = dq.read
            n = 0
            while True:
                for _ in range(batch):
                    if read() is None:
                        return n
                    n += 1
                s.maybe_sync(dq)

        def do_read_many(dq: DiskQueue, s: Syncer) -> int:
            n = 0
            while got := dq.read_many(batch):
                n += len(got)
                s.maybe_sync(dq)
            return n

        def do_pass(dq: DiskQueue, s: Syncer) -> int:
            put = dq.put
            n = 0
            for _ in range(count // batch):
                for _ in range(batch):
                    put(payload)
                n += len(dq.read_many(batch))
                s.maybe_sync(dq)
            return n

        run("put", args, base, "a", do_put)
        run("put_many", args, base, "b", do_put_many)
        run("read", args, base, "a", do_read)
        run("read_many", args, base, "b", do_read_many)
        run("pass", args, base, "c", do_pass)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
