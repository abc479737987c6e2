"""Client options: the keyword arguments of Producer and Consumer, resolved into a Config.

Names and defaults follow go-nsq's ``Config`` (durations are float seconds here), so the
tools' ``--consumer-opt=key,value`` / ``--producer-opt`` pass go-nsq option names straight
through :func:`apply_go_option`.
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import nsqpy
from nsqpy.common.goflags import parse_duration, parse_go_bool, parse_go_float, parse_go_int
from nsqpy.common.gotls import go_client_context

__all__ = [
    "Config",
    "ConnectionOptions",
    "ConsumerOptions",
    "ProducerOptions",
    "apply_go_option",
    "resolve",
]

DEFAULT_USER_AGENT = f"nsqpy/{nsqpy.__version__}"


class ConnectionOptions(TypedDict, total=False):
    """Options of every connection; most are sent to nsqd in IDENTIFY (spec §2.4)."""

    client_id: str
    """Shown in nsqd's stats (default: the short host name)."""
    hostname: str
    """Shown in nsqd's stats (default: the host name)."""
    user_agent: str
    """Default ``nsqpy/<version>``."""
    heartbeat_interval: float
    """Seconds between nsqd's heartbeats (default 30); ``-1`` disables them."""
    output_buffer_size: int
    """nsqd's output buffer for this client in bytes (default 16384); ``-1`` disables it."""
    output_buffer_timeout: float
    """Seconds nsqd may hold buffered messages (default 0.25); ``-1`` disables the timer."""
    msg_timeout: float
    """Seconds before nsqd times out an in-flight message (0: nsqd's ``--msg-timeout``)."""
    sample_rate: int
    """Deliver only this percentage (1-99) of the channel's messages; 0 = all."""
    tls_v1: bool
    """Upgrade the connection to TLS after IDENTIFY."""
    tls_context: ssl.SSLContext
    """Context for the TLS upgrade (default: ``ssl.create_default_context()``)."""
    tls_server_hostname: str
    """Name checked against nsqd's certificate (default: the host of the address)."""
    snappy: bool
    """Snappy-compress the stream after IDENTIFY."""
    deflate: bool
    """DEFLATE-compress the stream after IDENTIFY."""
    deflate_level: int
    """1-9, default 6 (nsqd caps it at ``--max-deflate-level``)."""
    auth_secret: str | bytes
    """Sent with AUTH when nsqd requires it."""
    dial_timeout: float
    """Seconds allowed to open the TCP connection (default 1)."""
    read_timeout: float
    """Close a connection that has received nothing for this long (default 60 s)."""
    reconnect_delay: float
    """First delay before reconnecting after a failure (default 0.5 s); doubles each time."""
    max_reconnect_delay: float
    """Cap of the reconnect back-off (default 15 s)."""


class ProducerOptions(ConnectionOptions, total=False):
    """Options of :class:`~nsqpy.client.Producer`."""

    reply_timeout: float
    """Seconds to wait for nsqd's reply to a publish before failing it (default 10)."""


class ConsumerOptions(ConnectionOptions, total=False):
    """Options of :class:`~nsqpy.client.Consumer` (go-nsq's consumer settings)."""

    max_in_flight: int
    """Messages in flight at once over all connections (default 1)."""
    max_attempts: int
    """Give up on a message delivered more often than this (default 5, 0 = never)."""
    lookupd_poll_interval: float
    """Seconds between nsqlookupd queries (default 60)."""
    lookupd_poll_jitter: float
    """Fraction of the interval to wait at random before the first poll (default 0.3)."""
    default_requeue_delay: float
    """REQ delay after a handler failure, multiplied by the attempts (default 90 s)."""
    max_requeue_delay: float
    """Cap of that delay (default 15 min)."""
    backoff_strategy: str
    """``"exponential"`` (default) or ``"full_jitter"``."""
    max_backoff_duration: float
    """Cap of the back-off after handler failures (default 120 s; 0 disables back-off)."""
    backoff_multiplier: float
    """Unit of the back-off: level n waits multiplier x 2^n seconds (default 1)."""
    low_rdy_idle_timeout: float
    """Take RDY back from a connection idle for this long when RDY is scarce (default 10)."""
    low_rdy_timeout: float
    """Take RDY back from a connection that has held it this long when scarce (default 30)."""
    rdy_redistribute_interval: float
    """Seconds between RDY redistribution passes (default 5)."""
    close_timeout: float
    """Seconds :meth:`close` waits for in-flight messages before dropping connections (30)."""


@dataclass
class Config:
    """Every option, resolved (defaults are go-nsq's)."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = DEFAULT_USER_AGENT
    heartbeat_interval: float = 30.0
    output_buffer_size: int = 16384
    output_buffer_timeout: float = 0.25
    msg_timeout: float = 0.0
    sample_rate: int = 0
    tls_v1: bool = False
    tls_context: ssl.SSLContext | None = None
    tls_server_hostname: str = ""
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | bytes | None = None
    dial_timeout: float = 1.0
    read_timeout: float = 60.0
    reconnect_delay: float = 0.5
    max_reconnect_delay: float = 15.0
    reply_timeout: float = 10.0
    max_in_flight: int = 1
    max_attempts: int = 5
    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    default_requeue_delay: float = 90.0
    max_requeue_delay: float = 900.0
    backoff_strategy: str = "exponential"
    max_backoff_duration: float = 120.0
    backoff_multiplier: float = 1.0
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    rdy_redistribute_interval: float = 5.0
    close_timeout: float = 30.0

    def identify_body(self) -> dict[str, Any]:
        """The IDENTIFY JSON go-nsq sends (milliseconds on the wire, -1 kept as -1)."""

        def ms(value: float) -> int:
            return -1 if value == -1 else round(value * 1000)

        return {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "tls_v1": self.tls_v1,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "snappy": self.snappy,
            "heartbeat_interval": ms(self.heartbeat_interval),
            "sample_rate": self.sample_rate,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": ms(self.output_buffer_timeout),
            "msg_timeout": ms(self.msg_timeout),
        }


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def resolve(options: Mapping[str, Any], allowed: type) -> Config:
    """Check ``options`` against the TypedDict ``allowed`` and build a :class:`Config`."""
    keys = allowed.__annotations__.keys() | _inherited_keys(allowed)
    unknown = set(options) - keys
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    config = Config(**options)
    if not config.hostname:
        config.hostname = socket.gethostname()
    if not config.client_id:
        config.client_id = config.hostname.split(".")[0]
    _validate(config)
    return config


def _inherited_keys(td: type) -> set[str]:
    keys: set[str] = set()
    for base in getattr(td, "__orig_bases__", ()):
        if isinstance(base, type) and hasattr(base, "__annotations__"):
            keys |= base.__annotations__.keys() | _inherited_keys(base)
    return keys


def _validate(c: Config) -> None:
    if c.max_in_flight < 0:
        raise ValueError(f"max_in_flight must be >= 0, not {c.max_in_flight}")
    if c.max_attempts < 0 or c.max_attempts > 65535:
        raise ValueError(f"max_attempts must be in [0, 65535], not {c.max_attempts}")
    if c.backoff_strategy not in ("exponential", "full_jitter"):
        raise ValueError(
            f"backoff_strategy must be exponential or full_jitter, not {c.backoff_strategy!r}"
        )
    if not 0 <= c.sample_rate <= 99:
        raise ValueError(f"sample_rate must be in [0, 99], not {c.sample_rate}")
    if not 0 <= c.lookupd_poll_jitter <= 1:
        raise ValueError(f"lookupd_poll_jitter must be in [0, 1], not {c.lookupd_poll_jitter}")
    if c.deflate and c.snappy:
        raise ValueError("cannot enable both deflate and snappy compression")
    if not 1 <= c.deflate_level <= 9:
        raise ValueError(f"deflate_level must be in [1, 9], not {c.deflate_level}")
    for name in ("dial_timeout", "reconnect_delay", "max_reconnect_delay", "reply_timeout"):
        if getattr(c, name) <= 0:
            raise ValueError(f"{name} must be > 0")


# -- go-nsq option names (the tools' --consumer-opt / --producer-opt) -------------------

# go-nsq options with another name or meaning here; the TLS file options build a context.
_GO_TLS_OPTIONS = (
    "tls_root_ca_file",
    "tls_insecure_skip_verify",
    "tls_cert",
    "tls_key",
    "tls_min_version",
)
# Accepted for compatibility, no effect on an asyncio client.
_GO_IGNORED = ("write_timeout", "local_addr")


def apply_go_option(options: dict[str, Any], opt: str, tls: dict[str, str] | None = None) -> None:
    """Apply one go-nsq ``ConfigFlag`` value, ``key,value`` (a bare ``key`` means true).

    ``tls`` collects the go-nsq TLS file options; pass it to :func:`tls_context_from_go`.
    Raises ValueError for an unknown option or a bad value, worded like go-nsq.
    """
    key, sep, value = opt.partition(",")
    if not sep:
        value = "true"
    if key in _GO_TLS_OPTIONS:
        if tls is not None:
            tls[key] = value
        return
    if key in _GO_IGNORED:
        return
    if key == "tls_config":
        raise ValueError("tls_config cannot be set from the command line")
    if key not in _FIELDS or key in ("tls_context", "tls_server_hostname", "close_timeout"):
        raise ValueError(f"invalid option {key}")
    kind = _FIELDS[key].type
    try:
        if kind == "bool":
            options[key] = parse_go_bool(value)
        elif kind == "int":
            options[key] = parse_go_int(value, base=10)
        elif kind == "float" and key == "lookupd_poll_jitter":
            options[key] = parse_go_float(value)
        elif kind == "float":
            seconds = _duration(value)
            # go-nsq's "disabled" is any negative duration; ours is -1
            options[key] = -1.0 if seconds < 0 else seconds
        else:
            options[key] = value
    except ValueError as err:
        raise ValueError(f"failed to set option {key} - {err}") from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError:
        return parse_go_int(text, base=10) / 1e9


def tls_context_from_go(tls: Mapping[str, str]) -> ssl.SSLContext:
    """An SSL context from go-nsq's tls_root_ca_file / tls_insecure_skip_verify / tls_cert /
    tls_key / tls_min_version options."""
    ctx = go_client_context(tls.get("tls_root_ca_file") or None)
    if parse_go_bool(tls.get("tls_insecure_skip_verify", "false")):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.get("tls_cert") or tls.get("tls_key"):
        ctx.load_cert_chain(tls["tls_cert"], tls.get("tls_key") or None)
    versions = {
        "ssl3.0": ssl.TLSVersion.SSLv3,
        "tls1.0": ssl.TLSVersion.TLSv1,
        "tls1.1": ssl.TLSVersion.TLSv1_1,
        "tls1.2": ssl.TLSVersion.TLSv1_2,
        "tls1.3": ssl.TLSVersion.TLSv1_3,
    }
    min_version = tls.get("tls_min_version", "").lower()
    if min_version:
        if min_version not in versions:
            raise ValueError(
                f"failed to set option tls_min_version - unknown tls version {min_version}"
            )
        ctx.minimum_version = versions[min_version]
    return ctx
