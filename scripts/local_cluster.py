"""Run a local NSQ: nsqlookupd, nsqd registered with it, and nsqadmin (``./scripts/run.sh``).

    nsqlookupd  TCP 127.0.0.1:4160, HTTP 127.0.0.1:4161
    nsqd        TCP 127.0.0.1:4150, HTTP 127.0.0.1:4151      data in ./data/nsqd
    nsqadmin    HTTP 127.0.0.1:4171                          http://127.0.0.1:4171/

Arguments are each server's own flags (Go syntax), nsqd's first; ``--nsqlookupd``,
``--nsqadmin`` and ``--nsqd`` switch to the next server's flags::

    run.sh --mem-queue-size=0 --nsqlookupd --http-address=127.0.0.1:4261 \\
           --nsqadmin --http-address=127.0.0.1:4271

A flag given here wins over the default above (Go's last value wins). nsqd registers with
the address nsqlookupd really listens on, and nsqadmin reads that nsqlookupd, so moving a
port needs no second flag. Each server's log goes to stderr as it is written (but for the
requests of nsqadmin's sampler); once all three listen, their addresses, the data folder
and how to stop are printed on stdout.
Ctrl-C (SIGINT) or SIGTERM stops all three gracefully, nsqd before nsqlookupd so that it
unregisters and flushes its queues to disk.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVERS = ("nsqlookupd", "nsqd", "nsqadmin")
SECTION = {f"--{name}": name for name in SERVERS}
START_TIMEOUT = 30.0
LISTENING = re.compile(r"\b(TCP|HTTP): listening on (\S+)")
# nsqadmin samples nsqlookupd and nsqd every 5 s for its charts: those requests' log lines
# would bury everything else, so they are not shown
SAMPLER = re.compile(
    rb"INFO: 200 GET (/nodes|/stats\?format=json&include_clients=false&include_mem=false) \("
)


@dataclass
class Server:
    """One server process, its log forwarded to stderr and scanned for its listeners."""

    name: str
    proc: subprocess.Popen[bytes]
    listening: dict[str, str] = field(default_factory=dict)  # "TCP"/"HTTP" -> host:port
    changed: threading.Condition = field(default_factory=threading.Condition)

    def forward_log(self) -> None:
        """Copy the server's output to stderr line by line, noting its listening lines."""
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if SAMPLER.search(raw):
                continue
            sys.stderr.buffer.write(raw)
            sys.stderr.flush()
            match = LISTENING.search(raw.decode("utf-8", "replace"))
            if match:
                with self.changed:
                    self.listening[match.group(1)] = match.group(2)
                    self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_listening(
        self, kinds: tuple[str, ...], deadline: float, stopping: threading.Event
    ) -> None:
        """Block until every listener in ``kinds`` is up; SystemExit if the server died,
        took too long, or Ctrl-C came first."""
        with self.changed:
            while not all(kind in self.listening for kind in kinds):
                if stopping.is_set():
                    raise SystemExit("run.sh: interrupted while starting")
                if self.proc.poll() is not None:
                    raise SystemExit(
                        f"run.sh: {self.name} exited (status {self.proc.returncode}); its log is"
                        " above (a port in use? move it: see the README)"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(f"run.sh: {self.name} did not listen within {START_TIMEOUT}s")
                self.changed.wait(min(left, 0.2))


def split_sections(argv: list[str]) -> dict[str, list[str]]:
    """The user's flags per server: nsqd's until a ``--<server>`` marker switches."""
    sections: dict[str, list[str]] = {name: [] for name in SERVERS}
    current = "nsqd"
    for arg in argv:
        if arg in SECTION:
            current = SECTION[arg]
        else:
            sections[current].append(arg)
    return sections


def flag_value(args: list[str], flag: str) -> str | None:
    """The last value of ``--flag`` (or ``-flag``; ``=value`` or a separate value) in args."""
    value = None
    for i, arg in enumerate(args):
        match = re.fullmatch(rf"--?{flag}(=(.*))?", arg)
        if match:
            value = match.group(2) if match.group(1) else (args[i + 1 : i + 2] or [""])[0]
    return value


def local(address: str) -> str:
    """An address to connect to: a wildcard listener is reached on 127.0.0.1."""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]", "::", "") else address


def start(name: str, args: list[str]) -> Server:
    proc = subprocess.Popen(
        [sys.executable, "-m", f"nsqpy.{name}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    server = Server(name, proc)
    threading.Thread(target=server.forward_log, daemon=True).start()
    return server


def say(text: str) -> None:
    print(text, flush=True)


def start_all(
    user: dict[str, list[str]], data: str, servers: list[Server], stopping: threading.Event
) -> None:
    """nsqlookupd first (nsqd needs its real TCP address), then nsqd and nsqadmin; each
    one started is in ``servers`` at once, so that it is stopped whatever happens next."""
    deadline = time.monotonic() + START_TIMEOUT
    lookupd_args = ["--tcp-address=127.0.0.1:4160", "--http-address=127.0.0.1:4161"]
    lookupd_args += ["--broadcast-address=127.0.0.1", *user["nsqlookupd"]]
    say("== starting nsqlookupd")
    servers.append(lookupd := start("nsqlookupd", lookupd_args))
    lookupd.wait_listening(("TCP", "HTTP"), deadline, stopping)
    nsqd_args = ["--tcp-address=127.0.0.1:4150", "--http-address=127.0.0.1:4151"]
    nsqd_args += [f"--lookupd-tcp-address={local(lookupd.listening['TCP'])}"]
    nsqd_args += ["--broadcast-address=127.0.0.1"]
    nsqd_args += [f"--data-path={data}"]
    say("== starting nsqd and nsqadmin")
    servers.append(nsqd := start("nsqd", [*nsqd_args, *user["nsqd"]]))
    admin_args = ["--http-address=127.0.0.1:4171"]
    if flag_value(user["nsqadmin"], "nsqd-http-address") is None:
        admin_args += [f"--lookupd-http-address={local(lookupd.listening['HTTP'])}"]
    servers.append(admin := start("nsqadmin", [*admin_args, *user["nsqadmin"]]))
    nsqd.wait_listening(("TCP", "HTTP"), deadline, stopping)
    admin.wait_listening(("HTTP",), deadline, stopping)


def banner(servers: list[Server], data: str) -> str:
    """What a user needs next: where everything listens, where the data is, how to stop."""
    lookupd, nsqd, admin = (s.listening for s in servers)
    # run.sh passes the time it started, so that the figure includes the environment check
    started = float(os.environ.get("NSQPY_RUN_STARTED") or 0) or time.time()
    return "\n".join(
        [
            f"== NSQ is ready ({time.time() - started:.1f}s after run.sh started)",
            f"   nsqd        TCP {local(nsqd['TCP'])}   HTTP http://{local(nsqd['HTTP'])}",
            f"   nsqlookupd  TCP {local(lookupd['TCP'])}   HTTP http://{local(lookupd['HTTP'])}",
            f"   nsqadmin    http://{local(admin['HTTP'])}/",
            f"   data        {data}",
            f"   stop        Ctrl-C (or: kill {os.getpid()})",
        ]
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    os.environ.setdefault("NSQPY_RUN_STARTED", str(time.time()))
    user = split_sections(sys.argv[1:])
    data = os.path.abspath(
        flag_value(user["nsqd"], "data-path") or os.path.join(ROOT, "data", "nsqd")
    )
    os.makedirs(data, exist_ok=True)
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    servers: list[Server] = []
    try:
        start_all(user, data, servers, stopping)
        say(banner(servers, data))
        while not stopping.is_set() and all(s.proc.poll() is None for s in servers):
            stopping.wait(0.2)
    except SystemExit as exc:
        print(exc, file=sys.stderr, flush=True)
        return 1
    finally:
        say("== stopping nsqadmin, nsqd, nsqlookupd")
        for server in reversed(servers):
            stop(server.proc)
    failed = [s.name for s in servers if s.proc.returncode not in (0, -signal.SIGTERM)]
    if failed and not stopping.is_set():
        print(f"run.sh: {', '.join(failed)} exited on its own", file=sys.stderr)
        return 1
    say("== stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
