"""nsqd's options: every command line flag of Go nsqd, its config key and default.

Mirrors ``nsqd/options.go`` (the ``Options`` struct and ``NewOptions``) and
``apps/nsqd/options.go`` (the flag set and its custom flag types) of NSQ
v1.3.0 plus the master-only flags.  :func:`validate` holds the checks Go's
``nsqd.New`` makes before starting.
"""

from __future__ import annotations

import enum
import hashlib
import socket
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from nsqpy.common.goflags import (
    Kind,
    LogLevel,
    OptionsError,
    ParseResult,
    flag,
    go_format_float,
    go_quote,
    http_client_connect_timeout_flag,
    http_client_request_timeout_flag,
    log_level_flag,
    log_prefix_flag,
    parse_args,
    parse_go_bool,
    verbose_flag,
)
from nsqpy.wire.names import is_ephemeral, is_valid_topic_name

__all__ = [
    "EXPERIMENTS",
    "TLS_VERSIONS",
    "TOPOLOGY_AWARE_CONSUMPTION",
    "LogLevel",
    "Options",
    "TLSRequired",
    "default_node_id",
    "parse_nsqd_args",
    "validate",
]


class TLSRequired(enum.IntEnum):
    """``--tls-required``: Go's TLSNotRequired / TLSRequiredExceptHTTP / TLSRequired."""

    NOT_REQUIRED = 0
    EXCEPT_HTTP = 1  # "tcp-https": TCP must upgrade to TLS, plain HTTP still served
    REQUIRED = 2

    @classmethod
    def parse(cls, text: str) -> TLSRequired:
        """``tlsRequiredOption.Set``: ``tcp-https`` or any Go boolean, case-insensitively."""
        lowered = text.lower()
        if lowered == "tcp-https":
            return cls.EXCEPT_HTTP
        try:
            required = parse_go_bool(lowered)
        except ValueError:
            raise ValueError(
                f"strconv.ParseBool: parsing {go_quote(lowered)}: invalid syntax"
            ) from None
        return cls.REQUIRED if required else cls.NOT_REQUIRED


# crypto/tls version numbers, which is what Go stores and /config reports.
TLS_VERSIONS: dict[str, int] = {
    "tls1.0": 0x0301,
    "tls1.1": 0x0302,
    "tls1.2": 0x0303,
    "tls1.3": 0x0304,
}

TOPOLOGY_AWARE_CONSUMPTION = "topology-aware-consumption"
EXPERIMENTS: tuple[str, ...] = (TOPOLOGY_AWARE_CONSUMPTION,)


def _parse_tls_min_version(text: str) -> str:
    """``tlsMinVersionOption.Set``; an empty value keeps the default."""
    lowered = text.lower()
    if lowered == "":
        return "tls1.0"
    if lowered not in TLS_VERSIONS:
        raise ValueError(f"unknown tlsVersionOption {go_quote(lowered)}")
    return lowered


def default_node_id(hostname: str | None = None) -> int:
    """Go's default ``--node-id``: ``crc32.ChecksumIEEE(md5.Sum(hostname)) % 1024``."""
    name = socket.gethostname() if hostname is None else hostname
    return zlib.crc32(hashlib.md5(name.encode("utf-8")).digest()) % 1024


_EXPERIMENT_CHOICES = ", ".join(f"'{e}'" for e in EXPERIMENTS)


# flag() returns a dataclasses.field(); ruff cannot see through the wrapper, hence the
# RUF009 suppressions (lint.flake8-bugbear.extend-immutable-calls would make them unneeded).
@dataclass
class Options:
    """Everything nsqd can be configured with; durations are float seconds."""

    # basic options
    log_level: LogLevel = log_level_flag()
    log_prefix: str = log_prefix_flag("[nsqd] ")
    verbose: bool = verbose_flag()
    node_id: int = flag(
        "node-id",
        default_factory=default_node_id,
        kind=Kind.INT,
        cfg="id",
        help="node part of message IDs, in [0,1024) (default is a hash of the hostname)",
    )
    worker_id: bool = flag(
        "worker-id", False, kind=Kind.BOOL, cfg="", help="[deprecated] use --node-id"
    )
    https_address: str = flag(
        "https-address", "0.0.0.0:4152", kind=Kind.STRING, help="<addr>:<port> for HTTPS clients"
    )
    http_address: str = flag(
        "http-address", "0.0.0.0:4151", kind=Kind.STRING, help="<addr>:<port> for HTTP clients"
    )
    tcp_address: str = flag(
        "tcp-address", "0.0.0.0:4150", kind=Kind.STRING, help="<addr>:<port> for TCP clients"
    )
    auth_http_addresses: list[str] = flag(
        "auth-http-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        cfg="auth_http_addresses",
        help="<addr>:<port> or URL of an auth server (may be given multiple times)",
    )
    auth_http_request_method: str = flag(
        "auth-http-request-method",
        "get",
        kind=Kind.STRING,
        help="HTTP method for auth server requests: get or post",
    )
    broadcast_address: str = flag(
        "broadcast-address",
        default_factory=socket.gethostname,
        kind=Kind.STRING,
        help="address registered with nsqlookupd (defaults to the OS hostname)",
    )
    broadcast_tcp_port: int = flag(
        "broadcast-tcp-port",
        0,
        kind=Kind.INT,
        help="TCP port registered with nsqlookupd (defaults to the listening port)",
    )
    broadcast_http_port: int = flag(
        "broadcast-http-port",
        0,
        kind=Kind.INT,
        help="HTTP port registered with nsqlookupd (defaults to the listening port)",
    )
    lookupd_tcp_addresses: list[str] = flag(
        "lookupd-tcp-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        cfg="nsqlookupd_tcp_addresses",
        help="nsqlookupd TCP address (may be given multiple times)",
    )
    http_client_connect_timeout: float = http_client_connect_timeout_flag()
    http_client_request_timeout: float = http_client_request_timeout_flag()
    topology_region: str = flag(
        "topology-region", "", kind=Kind.STRING, help="region of this nsqd (experimental)"
    )
    topology_zone: str = flag(
        "topology-zone", "", kind=Kind.STRING, help="zone of this nsqd (experimental)"
    )

    # diskqueue options
    data_path: str = flag(
        "data-path", "", kind=Kind.STRING, help="directory for disk-backed messages and metadata"
    )
    mem_queue_size: int = flag(
        "mem-queue-size",
        10000,
        kind=Kind.INT,
        help="messages kept in memory per topic and per channel",
    )
    max_bytes_per_file: int = flag(
        "max-bytes-per-file", 104857600, kind=Kind.INT, help="diskqueue file size before rolling"
    )
    sync_every: int = flag(
        "sync-every", 2500, kind=Kind.INT, help="diskqueue reads+writes between fsyncs"
    )
    sync_timeout: float = flag(
        "sync-timeout", 2.0, kind=Kind.DURATION, help="longest time between diskqueue fsyncs"
    )
    queue_scan_worker_pool_max: int = flag(
        "queue-scan-worker-pool-max",
        4,
        kind=Kind.INT,
        help="max workers checking in-flight and deferred timeouts",
    )
    queue_scan_selection_count: int = flag(
        "queue-scan-selection-count",
        20,
        kind=Kind.INT,
        help="channels checked per 100ms cycle for in-flight and deferred timeouts",
    )

    # message and command options
    msg_timeout: float = flag(
        "msg-timeout",
        60.0,
        kind=Kind.DURATION,
        help="default time before an in-flight message is requeued",
    )
    max_msg_timeout: float = flag(
        "max-msg-timeout",
        900.0,
        kind=Kind.DURATION,
        help="longest msg_timeout a client may ask for",
    )
    max_msg_size: int = flag(
        "max-msg-size", 1048576, kind=Kind.INT, help="largest message body in bytes"
    )
    max_req_timeout: float = flag(
        "max-req-timeout", 3600.0, kind=Kind.DURATION, help="longest requeue or publish deferral"
    )
    max_body_size: int = flag(
        "max-body-size", 5242880, kind=Kind.INT, help="largest command body in bytes"
    )

    # client overridable options
    max_heartbeat_interval: float = flag(
        "max-heartbeat-interval",
        60.0,
        kind=Kind.DURATION,
        help="longest heartbeat interval a client may ask for",
    )
    max_rdy_count: int = flag(
        "max-rdy-count", 2500, kind=Kind.INT, help="largest RDY count of a client"
    )
    max_output_buffer_size: int = flag(
        "max-output-buffer-size",
        65536,
        kind=Kind.INT,
        help="largest output buffer size (bytes) a client may ask for",
    )
    max_output_buffer_timeout: float = flag(
        "max-output-buffer-timeout",
        30.0,
        kind=Kind.DURATION,
        help="longest output buffer flush interval a client may ask for",
    )
    min_output_buffer_timeout: float = flag(
        "min-output-buffer-timeout",
        0.025,
        kind=Kind.DURATION,
        help="shortest output buffer flush interval a client may ask for",
    )
    output_buffer_timeout: float = flag(
        "output-buffer-timeout",
        0.25,
        kind=Kind.DURATION,
        help="default flush interval of buffered client writes",
    )
    max_channel_consumers: int = flag(
        "max-channel-consumers",
        0,
        kind=Kind.INT,
        help="most consumers per channel on this nsqd (0 = unlimited)",
    )
    workers: int = flag(
        "workers",
        1,
        kind=Kind.INT,
        help="processes serving this nsqd, each owning a share of the topics, to use more "
        "than one core (beyond NSQ: docs/SCALING.md)",
    )
    idle_poll: float = flag(
        "idle-poll",
        0.0001,
        kind=Kind.DURATION,
        help="longest the event loop polls for more input before it sleeps; adapts to the "
        "load, and under a steady one polls only where a trial finds that it pays, "
        "0 = sleep at once (beyond NSQ: docs/ARCHITECTURE.md)",
    )

    # message policies (beyond NSQ: docs/POLICIES.md); per topic/channel over HTTP
    max_attempts: int = flag(
        "max-attempts",
        0,
        kind=Kind.INT,
        help="deliveries before a message that comes back is dead-lettered (0 = unlimited)",
    )
    message_ttl: float = flag(
        "message-ttl",
        0.0,
        kind=Kind.DURATION,
        help="age after which a queued message is dead-lettered instead of delivered (0 = none)",
    )
    max_queue_depth: int = flag(
        "max-queue-depth",
        0,
        kind=Kind.INT,
        help="messages a topic or channel holds before its oldest are dead-lettered (0 = unlimited)",
    )
    dead_letter_topic_suffix: str = flag(
        "dead-letter-topic-suffix",
        "",
        kind=Kind.STRING,
        help="dead-letter to <topic><suffix> when no dead_letter_topic is set (e.g. _dead)",
    )

    # statsd integration
    statsd_address: str = flag(
        "statsd-address", "", kind=Kind.STRING, help="UDP <addr>:<port> of a statsd daemon"
    )
    statsd_interval: float = flag(
        "statsd-interval", 60.0, kind=Kind.DURATION, help="time between pushes to statsd"
    )
    statsd_mem_stats: bool = flag(
        "statsd-mem-stats", True, kind=Kind.BOOL, help="also send memory stats to statsd"
    )
    statsd_prefix: str = flag(
        "statsd-prefix",
        "nsq.%s",
        kind=Kind.STRING,
        help="prefix of statsd keys (%s is replaced by the host)",
    )
    statsd_udp_packet_size: int = flag(
        "statsd-udp-packet-size", 508, kind=Kind.INT, help="largest statsd UDP packet in bytes"
    )
    statsd_exclude_ephemeral: bool = flag(
        "statsd-exclude-ephemeral",
        False,
        kind=Kind.BOOL,
        help="leave ephemeral topics and channels out of statsd",
    )

    # end to end processing latency
    e2e_processing_latency_percentiles: list[float] = flag(
        "e2e-processing-latency-percentile",
        default_factory=list,
        kind=Kind.FLOAT_LIST,
        cfg="e2e_processing_latency_percentiles",
        help="latency percentile in (0,1] to track (repeatable or comma separated, e.g. 1.0,0.99)",
    )
    e2e_processing_latency_window_time: float = flag(
        "e2e-processing-latency-window-time",
        600.0,
        kind=Kind.DURATION,
        help="window of the end to end latency quantiles",
    )

    # TLS
    tls_cert: str = flag("tls-cert", "", kind=Kind.STRING, help="path to the certificate file")
    tls_key: str = flag("tls-key", "", kind=Kind.STRING, help="path to the key file")
    tls_client_auth_policy: str = flag(
        "tls-client-auth-policy",
        "",
        kind=Kind.STRING,
        help="client certificate policy: require or require-verify",
    )
    tls_root_ca_file: str = flag(
        "tls-root-ca-file", "", kind=Kind.STRING, help="path to the certificate authority file"
    )
    tls_required: TLSRequired = flag(
        "tls-required",
        TLSRequired.NOT_REQUIRED,
        kind=Kind.VALUE,
        parse=TLSRequired.parse,
        is_bool=True,
        show=lambda value: str(int(value)),
        help="require TLS for client connections: true, false or tcp-https",
    )
    tls_min_version: str = flag(
        "tls-min-version",
        "tls1.0",
        kind=Kind.VALUE,
        parse=_parse_tls_min_version,
        go_value=lambda name: TLS_VERSIONS[name],
        help="minimum TLS version: tls1.0, tls1.1, tls1.2 or tls1.3",
    )

    # compression
    deflate: bool = flag(
        "deflate", True, kind=Kind.BOOL, help="allow clients to negotiate deflate compression"
    )
    max_deflate_level: int = flag(
        "max-deflate-level",
        6,
        kind=Kind.INT,
        help="highest deflate level a client may ask for (1-9)",
    )
    snappy: bool = flag(
        "snappy", True, kind=Kind.BOOL, help="allow clients to negotiate snappy compression"
    )

    experiments: list[str] = flag(
        "enable-experiment",
        default_factory=list,
        kind=Kind.STRING_LIST,
        cfg="enable_experiment",
        help=f"enable an experimental feature (may be given multiple times) (valid: {_EXPERIMENT_CHOICES})",
    )

    # internals without a flag (nsqd.NewOptions sets them)
    client_timeout: float = 60.0
    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_dirty_percent: float = 0.25

    def __post_init__(self) -> None:
        # app.FloatArray keeps the percentiles sorted high to low.
        self.e2e_processing_latency_percentiles.sort(reverse=True)

    @property
    def tls_min_version_code(self) -> int:
        """``--tls-min-version`` as the crypto/tls number Go stores (769 for tls1.0)."""
        return TLS_VERSIONS[self.tls_min_version]

    def has_experiment(self, name: str) -> bool:
        """Whether ``--enable-experiment=name`` was given."""
        return name in self.experiments


def _join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    """``--statsd-prefix`` with ``%s`` → ``<broadcast_address>_<http port>`` (``.``/``:`` → ``_``).

    A non-empty prefix always ends in ``.``; an empty one stays empty.
    """
    if not template:
        return ""
    host_key = _join_host_port(broadcast_address, str(http_port))
    host_key = host_key.replace(".", "_").replace(":", "_")
    prefix = template.replace("%s", host_key)
    return prefix if prefix.endswith(".") else prefix + "."


def resolve_listeners(opts: Options, tcp_port: int, http_port: int) -> None:
    """What Go's nsqd.New does once it listens: a broadcast port left at 0 becomes the real
    one (``tcp_port``/``http_port``; 0 or less for a unix socket or no listener leaves it),
    and ``%s`` in --statsd-prefix becomes the broadcast host and HTTP port, as
    ``GET /config/...`` then shows them."""
    if not opts.broadcast_http_port and http_port > 0:
        opts.broadcast_http_port = http_port
    if not opts.broadcast_tcp_port and tcp_port > 0:
        opts.broadcast_tcp_port = tcp_port
    opts.statsd_prefix = statsd_prefix(
        opts.statsd_prefix, opts.broadcast_address, opts.broadcast_http_port
    )


def parse_nsqd_args(argv: Sequence[str]) -> ParseResult[Options]:
    """Parse nsqd's command line (without the program name) and ``--config`` file.

    ``result.version`` tells the caller to print ``version_string("nsqd")`` and
    exit 0; otherwise call :func:`validate` on ``result.options`` before use.
    Raises ``FlagError``, ``HelpRequested`` or ``ConfigError``.
    """
    return parse_args(Options, argv, prog="nsqd")


def validate(opts: Options) -> None:
    """nsqd's startup checks, in Go's order and with Go's messages.

    Like Go's ``nsqd.New`` it also normalises: a client auth policy turns on
    ``tls_required``, and the e2e percentiles are sorted in descending order.
    Raises :class:`OptionsError`.
    """
    if not isinstance(opts.log_level, LogLevel):
        try:
            opts.log_level = LogLevel(opts.log_level)
        except ValueError:
            raise OptionsError(f"invalid log level '{opts.log_level}'") from None
    if opts.tls_min_version not in TLS_VERSIONS:
        raise OptionsError(f"unknown tlsVersionOption {go_quote(opts.tls_min_version)}")
    if not 1 <= opts.max_deflate_level <= 9:
        raise OptionsError("--max-deflate-level must be [1,9]")
    if not 0 <= opts.node_id < 1024:
        raise OptionsError("--node-id must be [0,1024)")
    if opts.tls_client_auth_policy and opts.tls_required == TLSRequired.NOT_REQUIRED:
        opts.tls_required = TLSRequired.REQUIRED
    # Go builds no TLS config only when both are empty; with one of them the
    # TLS layer fails later when it loads the pair.
    if not opts.tls_cert and not opts.tls_key and opts.tls_required != TLSRequired.NOT_REQUIRED:
        raise OptionsError("cannot require TLS client connections without TLS key and cert")
    if opts.auth_http_request_method not in ("get", "post"):
        raise OptionsError("--auth-http-request-method must be post or get")
    for percentile in opts.e2e_processing_latency_percentiles:
        if not 0 < percentile <= 1:
            raise OptionsError(
                f"invalid E2E processing latency percentile: {go_format_float(percentile)}"
            )
    opts.e2e_processing_latency_percentiles.sort(reverse=True)
    if not 0 <= opts.max_attempts <= 0xFFFF:
        raise OptionsError("--max-attempts must be [0,65535]")
    if opts.message_ttl < 0:
        raise OptionsError("--message-ttl must be >= 0")
    if opts.max_queue_depth < 0:
        raise OptionsError("--max-queue-depth must be >= 0")
    if not 1 <= opts.workers <= 256:
        raise OptionsError("--workers must be [1,256]")
    if not 0 <= opts.idle_poll <= 0.01:
        raise OptionsError("--idle-poll must be [0,10ms]")
    suffix = opts.dead_letter_topic_suffix
    if suffix and (not is_valid_topic_name("t" + suffix) or is_ephemeral("t" + suffix)):
        raise OptionsError(
            f"--dead-letter-topic-suffix {go_quote(suffix)} makes invalid topic names"
        )
    for experiment in opts.experiments:
        if experiment not in EXPERIMENTS:
            raise OptionsError(
                f"invalid --enable-experiment {go_quote(experiment)} (valid: {_EXPERIMENT_CHOICES})"
            )
