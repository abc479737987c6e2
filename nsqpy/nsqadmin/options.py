"""nsqadmin's options: every flag of Go nsqadmin, plus nsqpy's own extras.

Mirrors ``nsqadmin/options.go`` and ``apps/nsqadmin/main.go`` of NSQ (master after
v1.3.0).  :func:`validate` holds the checks Go's ``nsqadmin.New`` makes before it
listens, with Go's messages.

Beyond NSQ (see ``docs/NSQADMIN.md``):

* ``--sample-interval`` / ``--history-duration``: nsqadmin samples the cluster and
  keeps a short in-memory history, so the UI draws rates and depths without Graphite;
* ``--http-auth-token`` and ``--basic-auth-user`` / ``--basic-auth-password``: optional
  protection of the whole UI and API (NSQ issue #1103).
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from nsqpy.common.goflags import (
    Kind,
    LogLevel,
    OptionsError,
    ParseResult,
    flag,
    http_client_connect_timeout_flag,
    http_client_request_timeout_flag,
    log_level_flag,
    log_prefix_flag,
    parse_args,
    verbose_flag,
)

__all__ = ["Options", "normalize_base_path", "parse_nsqadmin_args", "split_host_port", "validate"]


@dataclass
class Options:
    """Everything nsqadmin can be configured with; durations are float seconds."""

    log_level: LogLevel = log_level_flag()
    log_prefix: str = log_prefix_flag("[nsqadmin] ")
    verbose: bool = verbose_flag()
    http_address: str = flag(
        "http-address",
        "0.0.0.0:4171",
        kind=Kind.STRING,
        help="<addr>:<port> to listen on for HTTP clients",
    )
    base_path: str = flag("base-path", "/", kind=Kind.STRING, help="URL base path")
    dev_static_dir: str = flag(
        "dev-static-dir",
        "",
        kind=Kind.STRING,
        help="(development use only) serve static assets from this directory",
    )
    graphite_url: str = flag("graphite-url", "", kind=Kind.STRING, help="graphite HTTP address")
    proxy_graphite: bool = flag(
        "proxy-graphite", False, kind=Kind.BOOL, help="proxy HTTP requests to graphite"
    )
    statsd_counter_format: str = flag(
        "statsd-counter-format",
        "stats.counters.%s.count",
        kind=Kind.STRING,
        help="The counter stats key formatting applied by the implementation of statsd. "
        "If no formatting is desired, set this to an empty string.",
    )
    statsd_gauge_format: str = flag(
        "statsd-gauge-format",
        "stats.gauges.%s",
        kind=Kind.STRING,
        help="The gauge stats key formatting applied by the implementation of statsd. "
        "If no formatting is desired, set this to an empty string.",
    )
    statsd_prefix: str = flag(
        "statsd-prefix",
        "nsq.%s",
        kind=Kind.STRING,
        help="prefix used for keys sent to statsd (%s for host replacement, must match nsqd)",
    )
    statsd_interval: float = flag(
        "statsd-interval",
        60.0,
        kind=Kind.DURATION,
        help="time interval nsqd is configured to push to statsd (must match nsqd)",
    )
    notification_http_endpoint: str = flag(
        "notification-http-endpoint",
        "",
        kind=Kind.STRING,
        help="HTTP endpoint (fully qualified) to which POST notifications of admin actions will be sent",
    )
    http_client_connect_timeout: float = http_client_connect_timeout_flag()
    http_client_request_timeout: float = http_client_request_timeout_flag()
    http_client_tls_insecure_skip_verify: bool = flag(
        "http-client-tls-insecure-skip-verify",
        False,
        kind=Kind.BOOL,
        help="configure the HTTP client to skip verification of TLS certificates",
    )
    http_client_tls_root_ca_file: str = flag(
        "http-client-tls-root-ca-file",
        "",
        kind=Kind.STRING,
        help="path to CA file for the HTTP client",
    )
    http_client_tls_cert: str = flag(
        "http-client-tls-cert",
        "",
        kind=Kind.STRING,
        help="path to certificate file for the HTTP client",
    )
    http_client_tls_key: str = flag(
        "http-client-tls-key", "", kind=Kind.STRING, help="path to key file for the HTTP client"
    )
    allow_config_from_cidr: str = flag(
        "allow-config-from-cidr",
        "127.0.0.1/8",
        kind=Kind.STRING,
        help="A CIDR from which to allow HTTP requests to the /config endpoint",
    )
    acl_http_header: str = flag(
        "acl-http-header",
        "X-Forwarded-User",
        kind=Kind.STRING,
        help="HTTP header to check for authenticated admin users",
    )
    nsqlookupd_http_addresses: list[str] = flag(
        "lookupd-http-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        cfg="nsqlookupd_http_addresses",
        help="lookupd HTTP address (may be given multiple times)",
    )
    nsqd_http_addresses: list[str] = flag(
        "nsqd-http-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        cfg="nsqd_http_addresses",
        help="nsqd HTTP address (may be given multiple times)",
    )
    skip_resolve_on_startup: bool = flag(
        "skip-resolve-on-startup",
        False,
        kind=Kind.BOOL,
        help="skip DNS lookup of addresses on startup",
    )
    admin_users: list[str] = flag(
        "admin-user",
        default_factory=list,
        kind=Kind.STRING_LIST,
        cfg="admin_users",
        help="admin user (may be given multiple times; if specified, only these users will be "
        "able to perform privileged actions; acl-http-header is used to determine the "
        "authenticated user)",
    )

    # ---- nsqpy extras (not in Go nsqadmin) ------------------------------------------------
    sample_interval: float = flag(
        "sample-interval",
        5.0,
        kind=Kind.DURATION,
        help="[nsqpy] how often to sample the cluster for the UI's rate and depth charts (0 disables)",
    )
    history_duration: float = flag(
        "history-duration",
        900.0,
        kind=Kind.DURATION,
        help="[nsqpy] how much sampled history to keep in memory",
    )
    http_auth_token: str = flag(
        "http-auth-token",
        "",
        kind=Kind.STRING,
        help="[nsqpy] require this token (Authorization: Bearer, or ?auth_token= once in a browser) "
        "for every request but /ping",
    )
    basic_auth_user: str = flag(
        "basic-auth-user",
        "",
        kind=Kind.STRING,
        help="[nsqpy] require HTTP Basic authentication with this user (with --basic-auth-password)",
    )
    basic_auth_password: str = flag(
        "basic-auth-password",
        "",
        kind=Kind.STRING,
        help="[nsqpy] password for --basic-auth-user",
    )


def parse_nsqadmin_args(argv: Sequence[str]) -> ParseResult[Options]:
    """Parse nsqadmin's command line (without the program name) and ``--config`` file."""
    return parse_args(Options, argv, prog="nsqadmin")


def normalize_base_path(path: str) -> str:
    """Go's ``normalizeBasePath``: a leading slash, cleaned (``"/"`` when empty)."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    return posixpath.normpath(path).replace("//", "/")


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) → (host, port); ValueError when malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"address {address}: too many colons in address")
    number = int(port)
    if number > 65535:
        raise ValueError(f"address {address}: invalid port")
    return host, number


def validate(opts: Options) -> None:
    """nsqadmin's startup checks, in Go's order and with Go's messages.

    Also normalises ``base_path`` like Go's ``nsqadmin.New`` does.
    """
    if not opts.nsqd_http_addresses and not opts.nsqlookupd_http_addresses:
        raise OptionsError("--nsqd-http-address or --lookupd-http-address required")
    if opts.nsqd_http_addresses and opts.nsqlookupd_http_addresses:
        raise OptionsError("use --nsqd-http-address or --lookupd-http-address not both")
    if opts.http_client_tls_cert and not opts.http_client_tls_key:
        raise OptionsError("--http-client-tls-key must be specified with --http-client-tls-cert")
    if opts.http_client_tls_key and not opts.http_client_tls_cert:
        raise OptionsError("--http-client-tls-cert must be specified with --http-client-tls-key")
    if opts.http_client_tls_root_ca_file and not os.path.isfile(opts.http_client_tls_root_ca_file):
        raise OptionsError(
            f"failed to read TLS root CA file {opts.http_client_tls_root_ca_file} - "
            "open: no such file or directory"
        )
    for flag_name, addresses in (
        ("--lookupd-http-address", opts.nsqlookupd_http_addresses),
        ("--nsqd-http-address", opts.nsqd_http_addresses),
    ):
        for address in addresses:
            try:
                split_host_port(address)
            except ValueError as err:
                raise OptionsError(f"failed to resolve {flag_name} ({address}) - {err}") from None
    if opts.proxy_graphite and not opts.graphite_url:
        raise OptionsError("failed to parse --graphite-url () - empty url")
    if opts.allow_config_from_cidr:
        try:
            if "/" not in opts.allow_config_from_cidr:
                raise ValueError("no prefix length")
            ipaddress.ip_network(opts.allow_config_from_cidr, strict=False)
        except ValueError:
            raise OptionsError(
                f"failed to parse --allow-config-from-cidr ({opts.allow_config_from_cidr}) - "
                f"invalid CIDR address: {opts.allow_config_from_cidr}"
            ) from None
    if bool(opts.basic_auth_user) != bool(opts.basic_auth_password):
        raise OptionsError("--basic-auth-user and --basic-auth-password must be given together")
    if opts.sample_interval < 0:
        raise OptionsError("--sample-interval must be >= 0")
    if opts.sample_interval and opts.history_duration < opts.sample_interval:
        raise OptionsError("--history-duration must be at least --sample-interval")
    opts.base_path = normalize_base_path(opts.base_path)
