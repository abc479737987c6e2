"""``nsq_to_file``: consume topics into newline-delimited files, rotated and gzipped.

One :class:`FileLogger` per topic holds the messages it wrote until the file is synced
(fsync, or the gzip member closed and fsynced), then finishes them: a message is
acknowledged only once it is on disk. Syncs happen when ``--max-in-flight`` messages are
held, when the consumer is starved, every ``--sync-interval``, on rotation, on SIGHUP
(which also closes the files; the next message opens a new one) and at exit.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from nsqpy.client import Consumer, Message, NSQClientError, NSQLookupdError
from nsqpy.common.goflags import Kind, flag, format_duration
from nsqpy.common.log import Logger, LogLevel
from nsqpy.tools._common import (
    ConsumerFlags,
    HTTPClientFlags,
    consumer_options,
    fatal,
    get_json_from_each,
    on_signals,
    parse_tool_args,
    require_one_source,
    run,
)

if TYPE_CHECKING:
    import aiohttp  # imported when first used: it is slow to import

__all__ = ["FileLogger", "Options", "compute_filename_format", "go_strftime", "main"]


@dataclass
class Options(ConsumerFlags, HTTPClientFlags):
    """nsq_to_file's flags (apps/nsq_to_file/options.go)."""

    topics: list[str] = flag(
        "topic",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="nsq topic (may be given multiple times)",
    )
    topic_pattern: str = flag(
        "topic-pattern", "", kind=Kind.STRING, help="only log topics matching the following pattern"
    )
    topic_refresh: float = flag(
        "topic-refresh",
        60.0,
        kind=Kind.DURATION,
        help="how frequently the topic list should be refreshed",
    )
    channel: str = flag("channel", "nsq_to_file", kind=Kind.STRING, help="nsq channel")
    log_prefix: str = flag(
        "log-prefix", "[nsq_to_file] ", kind=Kind.STRING, help="log message prefix"
    )
    log_level: LogLevel = flag(
        "log-level",
        LogLevel.INFO,
        kind=Kind.VALUE,
        parse=LogLevel.parse,
        show=lambda level: level.name.lower(),
        help="set log verbosity: debug, info, warn, error, or fatal",
    )
    output_dir: str = flag(
        "output-dir", "/tmp", kind=Kind.STRING, help="directory to write output files to"
    )
    work_dir: str = flag(
        "work-dir",
        "",
        kind=Kind.STRING,
        help="directory for in-progress files before moving to output-dir",
    )
    datetime_format: str = flag(
        "datetime-format",
        "%Y-%m-%d_%H",
        kind=Kind.STRING,
        help="strftime compatible format for <DATETIME> in filename format",
    )
    filename_format: str = flag(
        "filename-format",
        "<TOPIC>.<HOST><REV>.<DATETIME>.log",
        kind=Kind.STRING,
        help="output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. "
        "<REV> is increased when file already exists)",
    )
    host_identifier: str = flag(
        "host-identifier",
        "",
        kind=Kind.STRING,
        help="value to output in log filename in place of hostname. <SHORT_HOST> and "
        "<HOSTNAME> are valid replacement tokens",
    )
    gzip_level: int = flag(
        "gzip-level",
        6,
        kind=Kind.INT,
        help="gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)",
    )
    gzip: bool = flag("gzip", False, kind=Kind.BOOL, help="gzip output files.")
    skip_empty_files: bool = flag(
        "skip-empty-files", False, kind=Kind.BOOL, help="skip writing empty files"
    )
    rotate_size: int = flag(
        "rotate-size",
        0,
        kind=Kind.INT,
        help="rotate the file when it grows bigger than `rotate-size` bytes",
    )
    rotate_interval: float = flag(
        "rotate-interval", 0.0, kind=Kind.DURATION, help="rotate the file every duration"
    )
    sync_interval: float = flag(
        "sync-interval", 30.0, kind=Kind.DURATION, help="sync file to disk every duration"
    )


# jehiah/go-strftime as NSQ copies it: only these conversions; anything else is literal.
_STRFTIME = {
    "B": "%B",
    "b": "%b",
    "m": "%m",
    "A": "%A",
    "a": "%a",
    "d": "%d",
    "H": "%H",
    "I": "%I",
    "M": "%M",
    "S": "%S",
    "Y": "%Y",
    "y": "%y",
    "p": "%p",
    "Z": "%Z",
    "z": "%z",
}


def go_strftime(fmt: str, t: time.struct_time) -> str:
    """nsq_to_file's strftime: ``%Y-%m-%d_%H`` etc.; unknown ``%x`` stays as it is."""
    out: list[str] = []
    i = 0
    n = len(fmt)
    while i < n:
        ch = fmt[i]
        if ch == "%" and i + 1 < n:
            code = fmt[i + 1]
            if code == "%":
                out.append("%")
                i += 2
                continue
            if code in _STRFTIME:
                out.append(time.strftime(_STRFTIME[code], t))
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def compute_filename_format(opts: Options, topic: str) -> str:
    """The file name template of ``topic``: every token but ``<DATETIME>`` and ``<REV>``
    replaced; ``.gz`` appended with --gzip unless there already (Go's
    computeFilenameFormat). Raises ValueError when <REV> is missing but needed."""
    hostname = socket.gethostname()
    short = hostname.split(".")[0]
    identifier = short
    if opts.host_identifier:
        identifier = opts.host_identifier.replace("<SHORT_HOST>", short)
        identifier = identifier.replace("<HOSTNAME>", hostname)
    cff = opts.filename_format
    work_dir = opts.work_dir or opts.output_dir
    if opts.gzip or opts.rotate_size > 0 or opts.rotate_interval > 0 or work_dir != opts.output_dir:
        if "<REV>" not in cff:
            raise ValueError(
                "missing <REV> in --filename-format when gzip, rotation, or work dir enabled"
            )
    else:
        cff = cff.replace("<REV>", "")
    cff = cff.replace("<TOPIC>", topic).replace("<HOST>", identifier)
    cff = cff.replace("<PID>", str(os.getpid()))
    if opts.gzip and not cff.endswith(".gz"):
        cff += ".gz"
    return cff


def _exclusive_rename(src: str, dst: str) -> None:
    os.link(src, dst)
    os.remove(src)


def _go_join(a: str, b: str) -> str:
    # Go's path.Join: joined and cleaned.
    return os.path.normpath(os.path.join(a, b)) if a else os.path.normpath(b)


class FileLogger:
    """One topic's consumer and output file (Go's FileLogger)."""

    def __init__(self, opts: Options, topic: str, logger: Logger, options: dict[str, Any]):
        self.opts = opts
        self.topic = topic
        self.log = logger
        self.tag = f"[{topic}/{opts.channel}]"
        self.filename_format = compute_filename_format(opts, topic)
        self.work_dir = opts.work_dir or opts.output_dir
        self.out: IO[bytes] | None = None
        self.gz: gzip.GzipFile | None = None
        self.filename = ""
        self.path = ""
        self.open_time = 0.0
        self.filesize = 0
        self.rev = 0
        self.pending: list[Message] = []
        self.stopping = False
        self.consumer = Consumer(
            topic,
            opts.channel,
            batch_handler=self.handle,
            nsqd_tcp_addresses=opts.nsqd_tcp_addresses,
            lookupd_http_addresses=opts.lookupd_http_addresses,
            **options,
        )
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    def _fatal(self, msg: str) -> None:
        self.log.fatal(f"{self.tag} {msg}")
        os._exit(1)

    # -- the router -----------------------------------------------------------------------

    def handle(self, messages: list[Message]) -> None:
        sync = False
        for msg in messages:
            msg.disable_auto_response()
            if self.needs_rotation():
                self.update_file()
                sync = True
            try:
                self.write(msg.body)
                self.write(b"\n")
            except OSError as err:
                self._fatal(f"writing message to disk: {err}")
            self.pending.append(msg)
            if len(self.pending) >= self.opts.max_in_flight:
                sync = True
        if sync or self.stopping or self.consumer.is_starved():
            self.sync_pending()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.opts.sync_interval)
            if self.needs_rotation():
                if self.opts.skip_empty_files:
                    self.sync_pending()
                    self.close()
                    continue
                self.update_file()
            self.sync_pending()

    def sync_pending(self) -> None:
        if not self.pending:
            return
        self.log.info(f"{self.tag} syncing {len(self.pending)} records to disk")
        try:
            self.sync()
        except OSError as err:
            self._fatal(f"failed syncing messages: {err}")
        pending, self.pending = self.pending, []
        for msg in pending:
            msg.finish()

    def hup(self) -> None:
        """SIGHUP: sync and close the current file."""
        self.sync_pending()
        self.close()

    async def stop(self) -> None:
        """Sync what is held, stop the consumer (syncing what still arrives), close."""
        self.stopping = True
        if self._ticker is not None:
            self._ticker.cancel()
        self.sync_pending()
        await self.consumer.close()
        self.sync_pending()
        self.close()

    # -- the file -------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.gz is not None:
            self.gz.write(data)
        else:
            assert self.out is not None
            self.out.write(data)
        self.filesize += len(data)

    def sync(self) -> None:
        assert self.out is not None
        if self.gz is not None:
            # End the gzip member and start another (concatenated): the member trailer's
            # checksum tells which messages were acknowledged.
            self.gz.close()
            self.out.flush()
            os.fsync(self.out.fileno())
            self.gz = self._gzip_writer(self.out)
        else:
            self.out.flush()
            os.fsync(self.out.fileno())

    def _gzip_writer(self, out: IO[bytes]) -> gzip.GzipFile:
        return gzip.GzipFile(
            filename="", mode="wb", compresslevel=self.opts.gzip_level, fileobj=out, mtime=0
        )

    def current_filename(self) -> str:
        datetime = go_strftime(self.opts.datetime_format, time.localtime())
        return self.filename_format.replace("<DATETIME>", datetime)

    def needs_rotation(self) -> bool:
        if self.out is None:
            return True
        filename = self.current_filename()
        if filename != self.filename:
            self.log.info(f"{self.tag} new filename {filename}, rotating...")
            return True
        opts = self.opts
        if opts.rotate_interval > 0:
            since = time.monotonic() - self.open_time
            if since > opts.rotate_interval:
                self.log.info(f"{self.tag} {format_duration(since)} since last open, rotating...")
                return True
        if opts.rotate_size > 0 and self.filesize > opts.rotate_size:
            self.log.info(
                f"{self.tag} {self.path} currently {self.filesize} bytes "
                f"(> {opts.rotate_size}), rotating..."
            )
            return True
        return False

    def update_file(self) -> None:
        self.close()  # uses the current filename and rev to resolve a rename conflict
        opts = self.opts
        filename = self.current_filename()
        if filename != self.filename:
            self.rev = 0  # a new file name starts again at revision 0
        else:
            self.rev += 1
        self.filename = filename
        self.open_time = time.monotonic()
        full_path = _go_join(self.work_dir, filename)
        self._make_dir(full_path)
        exclusive = opts.gzip or opts.rotate_interval > 0
        while True:
            abs_name = full_path.replace("<REV>", f"-{self.rev:06d}")
            if self.work_dir != opts.output_dir:
                output_name = self._output_name(abs_name)
                self._make_dir(output_name)
                if os.path.exists(output_name):
                    self.log.warn(f"{self.tag} output file already exists: {output_name}")
                    self.rev += 1
                    continue
            flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND)
            try:
                fd = os.open(abs_name, flags, 0o666)
            except FileExistsError:
                self.log.warn(f"{self.tag} working file already exists: {abs_name}")
                self.rev += 1
                continue
            except OSError as err:
                self._fatal(f"unable to open {abs_name}: {err}")
                raise
            self.log.info(f"{self.tag} opening {abs_name}")
            size = os.fstat(fd).st_size
            if opts.rotate_size > 0 and size > opts.rotate_size:
                self.log.info(
                    f"{self.tag} {abs_name} currently {size} bytes (> {opts.rotate_size}), "
                    "rotating..."
                )
                os.close(fd)
                self.rev += 1
                continue
            break
        self.out = open(fd, "wb", closefd=True)  # noqa: SIM115 - closed in close()
        self.path = abs_name
        self.filesize = size
        self.gz = self._gzip_writer(self.out) if opts.gzip else None

    def _output_name(self, work_name: str) -> str:
        rel = work_name[len(self.work_dir) :] if work_name.startswith(self.work_dir) else work_name
        return os.path.join(self.opts.output_dir, rel.lstrip(os.sep))

    def _make_dir(self, path: str) -> None:
        directory = os.path.dirname(path)
        if directory:
            try:
                os.makedirs(directory, 0o770, exist_ok=True)
            except OSError as err:
                self._fatal(f"unable to create dir: {err}")

    def close(self) -> None:
        """Close the current file (moving it from the work dir to the output dir)."""
        out = self.out
        if out is None:
            return
        try:
            if self.gz is not None:
                self.gz.close()
                self.gz = None
            out.flush()
            os.fsync(out.fileno())
            out.close()
        except OSError as err:
            self._fatal(f"failed to close output file: {err}")
        self.out = None
        if self.work_dir == self.opts.output_dir:
            return
        self._move(self.path)

    def _move(self, src: str) -> None:
        dst = self._output_name(src)
        self.log.info(f"{self.tag} moving finished file {src} to {dst}")
        try:
            _exclusive_rename(src, dst)
            return
        except FileExistsError:
            pass
        except OSError as err:
            self._fatal(f"unable to move file from {src} to {dst}: {err}")
        template = os.path.join(os.path.dirname(dst), os.path.basename(self.filename))
        i = self.rev + 1
        while True:
            self.log.warn(f"{self.tag} destination file already exists: {dst}")
            dst = template.replace("<REV>", f"-{i:06d}")
            try:
                _exclusive_rename(src, dst)
            except FileExistsError:
                i += 1
                continue
            except OSError as err:
                self._fatal(f"unable to rename file from {src} to {dst}: {err}")
            self.log.info(f"{self.tag} renamed finished file {src} to {dst} to avoid overwrite")
            return


class _LogBridge(logging.Handler):
    """The client's log lines through nsq_to_file's logger (prefix and --log-level)."""

    LEVELS = {
        logging.DEBUG: LogLevel.DEBUG,
        logging.INFO: LogLevel.INFO,
        logging.WARNING: LogLevel.WARN,
        logging.ERROR: LogLevel.ERROR,
        logging.CRITICAL: LogLevel.FATAL,
    }

    def __init__(self, logger: Logger) -> None:
        super().__init__()
        self.logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        self.logger.log(self.LEVELS.get(record.levelno, LogLevel.INFO), record.getMessage())


async def lookupd_topics(session: aiohttp.ClientSession, lookupds: Sequence[str]) -> list[str]:
    """Every topic the lookupds know (clusterinfo's GetLookupdTopics)."""
    answers, errors = await get_json_from_each(session, lookupds, _topics_url)
    topics: set[str] = set()
    for _, doc in answers:
        topics.update(doc.get("topics") or [])
    if errors and len(errors) == len(lookupds):
        raise NSQLookupdError("; ".join(errors))
    return sorted(topics)


def _topics_url(address: str) -> str:
    base = address if "://" in address else "http://" + address
    return base.rstrip("/") + "/topics"


class TopicDiscoverer:
    """The FileLoggers, one per topic; with no --topic, topics come from the lookupds."""

    def __init__(self, opts: Options, logger: Logger, options: dict[str, Any]) -> None:
        self.opts = opts
        self.log = logger
        self.options = options
        self.loggers: dict[str, FileLogger] = {}
        self.pattern = re.compile(opts.topic_pattern) if opts.topic_pattern else None

    def allowed(self, topic: str) -> bool:
        return self.pattern is None or self.pattern.search(topic) is not None

    async def update_topics(self, topics: Sequence[str]) -> list[str]:
        """Start a FileLogger for each new allowed topic; the errors of those that failed."""
        errors: list[str] = []
        for topic in topics:
            if topic in self.loggers:
                continue
            if not self.allowed(topic):
                self.log.warn(
                    f"skipping topic {topic} (doesn't match pattern {self.opts.topic_pattern})"
                )
                continue
            try:
                fl = FileLogger(self.opts, topic, self.log, self.options)
                await fl.start()
            except (ValueError, TypeError, NSQClientError) as err:
                errors.append(f"couldn't create logger for new topic {topic}: {err}")
                if not self.opts.topics:  # discovered: the next refresh tries again
                    self.log.error(errors[-1])
                continue
            self.loggers[topic] = fl
        return errors

    async def run(self) -> None:
        opts = self.opts
        stop = asyncio.Event()
        on_signals(stop.set)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.hup)
        if errors := await self.update_topics(opts.topics):
            # Divergence: Go logs this and runs on, archiving nothing, for a --topic that
            # is never tried again; a bad topic or an nsqd that is down ends the run here.
            await asyncio.gather(*(fl.stop() for fl in self.loggers.values()))
            for line in errors:
                self.log.fatal(line)
            raise SystemExit(1)
        import aiohttp

        async with aiohttp.ClientSession(timeout=opts.client_timeout()) as session:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), opts.topic_refresh)
                except TimeoutError:
                    pass
                if stop.is_set() or opts.topics:
                    continue
                try:
                    topics = await lookupd_topics(session, opts.lookupd_http_addresses)
                except NSQLookupdError as err:
                    self.log.error(f"could not retrieve topic list: {err}")
                    continue
                await self.update_topics(topics)
        await asyncio.gather(*(fl.stop() for fl in self.loggers.values()))

    def hup(self) -> None:
        for fl in self.loggers.values():
            fl.hup()


async def archive(opts: Options) -> int:
    logger = Logger(opts.log_prefix, opts.log_level)
    if not opts.channel:
        fatal("--channel is required")
    opts.check_http_timeouts()
    require_one_source(opts.nsqd_tcp_addresses, opts.lookupd_http_addresses, suffix=".")
    if not 1 <= opts.gzip_level <= 9:
        fatal(f"invalid --gzip-level value ({opts.gzip_level}), should be 1-9")
    if not opts.topics and not opts.topic_pattern:
        fatal("--topic or --topic-pattern required")
    if not opts.topics and not opts.lookupd_http_addresses:
        fatal("--lookupd-http-address must be specified when no --topic specified")
    if opts.topic_pattern:
        try:
            re.compile(opts.topic_pattern)
        except re.error as err:
            fatal(f"invalid --topic-pattern: {err}")
    bridge = _LogBridge(logger)
    client_log = logging.getLogger("nsqpy.client")
    client_log.handlers[:] = [bridge]
    client_log.setLevel(logging.DEBUG if opts.log_level <= LogLevel.DEBUG else logging.INFO)
    client_log.propagate = False
    options = consumer_options(opts.consumer_opts, "nsq_to_file", opts.max_in_flight)
    await TopicDiscoverer(opts, logger, options).run()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """The ``nsq_to_file`` command."""
    opts = parse_tool_args(Options, argv, "nsq_to_file").options
    run(lambda: archive(opts))


if __name__ == "__main__":
    main()
