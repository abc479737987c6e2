"""nsqd's Options: spec §1 defaults and config keys, parsing, and startup validation."""

from __future__ import annotations

import binascii
import hashlib
import socket
from pathlib import Path

import pytest

from nsqpy.common.goflags import (
    ConfigError,
    FlagError,
    OptionsError,
    flag_specs,
    option_by_cfg_name,
    usage,
    version_string,
)
from nsqpy.nsqd.options import (
    TLS_VERSIONS,
    TOPOLOGY_AWARE_CONSUMPTION,
    LogLevel,
    Options,
    TLSRequired,
    default_node_id,
    parse_nsqd_args,
    validate,
)

# flag → (config key, default) straight from spec §1 (durations in seconds).
SPEC_FLAGS: dict[str, tuple[str | None, object]] = {
    "log-level": ("log_level", LogLevel.INFO),
    "log-prefix": ("log_prefix", "[nsqd] "),
    "verbose": (None, False),
    "worker-id": (None, False),
    "tcp-address": ("tcp_address", "0.0.0.0:4150"),
    "http-address": ("http_address", "0.0.0.0:4151"),
    "https-address": ("https_address", "0.0.0.0:4152"),
    "broadcast-address": ("broadcast_address", socket.gethostname()),
    "broadcast-tcp-port": ("broadcast_tcp_port", 0),
    "broadcast-http-port": ("broadcast_http_port", 0),
    "lookupd-tcp-address": ("nsqlookupd_tcp_addresses", []),
    "auth-http-address": ("auth_http_addresses", []),
    "auth-http-request-method": ("auth_http_request_method", "get"),
    "http-client-connect-timeout": ("http_client_connect_timeout", 2.0),
    "http-client-request-timeout": ("http_client_request_timeout", 5.0),
    "topology-region": ("topology_region", ""),
    "topology-zone": ("topology_zone", ""),
    "data-path": ("data_path", ""),
    "mem-queue-size": ("mem_queue_size", 10000),
    "max-bytes-per-file": ("max_bytes_per_file", 104857600),
    "sync-every": ("sync_every", 2500),
    "sync-timeout": ("sync_timeout", 2.0),
    "queue-scan-worker-pool-max": ("queue_scan_worker_pool_max", 4),
    "queue-scan-selection-count": ("queue_scan_selection_count", 20),
    "msg-timeout": ("msg_timeout", 60.0),
    "max-msg-timeout": ("max_msg_timeout", 900.0),
    "max-msg-size": ("max_msg_size", 1048576),
    "max-req-timeout": ("max_req_timeout", 3600.0),
    "max-body-size": ("max_body_size", 5242880),
    "max-heartbeat-interval": ("max_heartbeat_interval", 60.0),
    "max-rdy-count": ("max_rdy_count", 2500),
    "max-output-buffer-size": ("max_output_buffer_size", 65536),
    "max-output-buffer-timeout": ("max_output_buffer_timeout", 30.0),
    "min-output-buffer-timeout": ("min_output_buffer_timeout", 0.025),
    "output-buffer-timeout": ("output_buffer_timeout", 0.25),
    "max-channel-consumers": ("max_channel_consumers", 0),
    # message policies (beyond NSQ, docs/POLICIES.md)
    "max-attempts": ("max_attempts", 0),
    "message-ttl": ("message_ttl", 0.0),
    "max-queue-depth": ("max_queue_depth", 0),
    "dead-letter-topic-suffix": ("dead_letter_topic_suffix", ""),
    "idle-poll": ("idle_poll", 0.0001),
    "workers": ("workers", 1),
    "statsd-address": ("statsd_address", ""),
    "statsd-interval": ("statsd_interval", 60.0),
    "statsd-mem-stats": ("statsd_mem_stats", True),
    "statsd-prefix": ("statsd_prefix", "nsq.%s"),
    "statsd-udp-packet-size": ("statsd_udp_packet_size", 508),
    "statsd-exclude-ephemeral": ("statsd_exclude_ephemeral", False),
    "e2e-processing-latency-percentile": ("e2e_processing_latency_percentiles", []),
    "e2e-processing-latency-window-time": ("e2e_processing_latency_window_time", 600.0),
    "tls-cert": ("tls_cert", ""),
    "tls-key": ("tls_key", ""),
    "tls-client-auth-policy": ("tls_client_auth_policy", ""),
    "tls-root-ca-file": ("tls_root_ca_file", ""),
    "tls-required": ("tls_required", TLSRequired.NOT_REQUIRED),
    "tls-min-version": ("tls_min_version", "tls1.0"),
    "deflate": ("deflate", True),
    "max-deflate-level": ("max_deflate_level", 6),
    "snappy": ("snappy", True),
    "enable-experiment": ("enable_experiment", []),
    "node-id": ("id", default_node_id()),
}


def nsqd(*argv: str) -> Options:
    return parse_nsqd_args(list(argv)).options


def valid(**changes: object) -> Options:
    opts = Options()
    for name, value in changes.items():
        setattr(opts, name, value)
    validate(opts)
    return opts


def invalid(message: str, **changes: object) -> None:
    opts = Options()
    for name, value in changes.items():
        setattr(opts, name, value)
    with pytest.raises(OptionsError) as info:
        validate(opts)
    assert str(info.value) == message


# ------------------------------------------------------------------ declarations


def test_every_spec_flag_is_declared_with_its_cfg_key_and_default() -> None:
    specs = {s.name: s for s in flag_specs(Options)}
    assert set(specs) == set(SPEC_FLAGS)
    opts = Options()
    for name, (cfg, default) in SPEC_FLAGS.items():
        spec = specs[name]
        assert spec.cfg == cfg, name
        assert getattr(opts, spec.attr) == default, name


def test_internal_options() -> None:
    opts = Options()
    assert opts.client_timeout == 60.0
    assert opts.queue_scan_interval == 0.1
    assert opts.queue_scan_refresh_interval == 5.0
    assert opts.queue_scan_dirty_percent == 0.25
    assert option_by_cfg_name(opts, "client_timeout") is None


def test_default_node_id_is_crc32_of_md5_of_hostname() -> None:
    for host in ("localhost", "nsqd-1.example.com", ""):
        expected = binascii.crc32(hashlib.md5(host.encode()).digest()) % 1024
        assert default_node_id(host) == expected
        assert 0 <= default_node_id(host) < 1024
    assert Options().node_id == default_node_id(socket.gethostname())


def test_usage_lists_builtins_and_master_flags() -> None:
    text = usage(Options, "nsqd")
    assert text.startswith("Usage of nsqd:\n")
    for name in ("-version\n", "-config string\n", "-enable-experiment value\n", "-tls-required\n"):
        assert "  " + name in text


# ------------------------------------------------------------------ parsing


def test_version_flag() -> None:
    result = parse_nsqd_args(["--version"])
    assert result.version is True
    assert version_string("nsqd") == "nsqd v1.3.0 (built w/nsqpy-0.1.0)"


def test_typical_command_line() -> None:
    opts = nsqd(
        "--tcp-address=127.0.0.1:0",
        "--http-address",
        "127.0.0.1:0",
        "--lookupd-tcp-address=127.0.0.1:4160",
        "--lookupd-tcp-address=127.0.0.1:4162",
        "--msg-timeout=2s",
        "--mem-queue-size=0",
        "--verbose",
        "--node-id=7",
        "--snappy=false",
        "--log-level=debug",
    )
    assert opts.tcp_address == "127.0.0.1:0"
    assert opts.http_address == "127.0.0.1:0"
    assert opts.lookupd_tcp_addresses == ["127.0.0.1:4160", "127.0.0.1:4162"]
    assert opts.msg_timeout == 2.0
    assert opts.mem_queue_size == 0
    assert opts.verbose is True
    assert opts.node_id == 7
    assert opts.snappy is False
    assert opts.log_level is LogLevel.DEBUG


def test_worker_id_is_an_accepted_no_op_bool() -> None:
    assert nsqd("--worker-id").worker_id is True
    with pytest.raises(FlagError):
        nsqd("--worker-id=5")


def test_empty_http_address_disables_http() -> None:
    assert nsqd("--http-address=").http_address == ""


def test_unknown_flag_text() -> None:
    with pytest.raises(FlagError) as info:
        nsqd("--max-defer-timeout=1h")
    assert str(info.value) == "flag provided but not defined: -max-defer-timeout"


def test_bad_duration_text() -> None:
    with pytest.raises(FlagError) as info:
        nsqd("--msg-timeout=x")
    assert str(info.value) == 'invalid value "x" for flag -msg-timeout: parse error'


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tls-required"], TLSRequired.REQUIRED),
        (["-tls-required"], TLSRequired.REQUIRED),
        (["--tls-required=true"], TLSRequired.REQUIRED),
        (["--tls-required=1"], TLSRequired.REQUIRED),
        (["--tls-required=TRUE"], TLSRequired.REQUIRED),
        (["--tls-required=false"], TLSRequired.NOT_REQUIRED),
        (["--tls-required=0"], TLSRequired.NOT_REQUIRED),
        (["--tls-required=tcp-https"], TLSRequired.EXCEPT_HTTP),
        (["--tls-required=TCP-HTTPS"], TLSRequired.EXCEPT_HTTP),
    ],
)
def test_tls_required_forms(argv: list[str], expected: TLSRequired) -> None:
    assert nsqd(*argv).tls_required is expected


def test_tls_required_is_bool_like_and_takes_no_separate_value() -> None:
    result = parse_nsqd_args(["--tls-required", "tcp-https"])
    assert result.options.tls_required is TLSRequired.REQUIRED
    assert result.args == ["tcp-https"]


def test_tls_required_bad_value() -> None:
    with pytest.raises(FlagError) as info:
        nsqd("--tls-required=maybe")
    assert str(info.value) == (
        'invalid boolean value "maybe" for -tls-required: '
        'strconv.ParseBool: parsing "maybe": invalid syntax'
    )


@pytest.mark.parametrize(
    ("text", "name", "code"),
    [
        ("tls1.0", "tls1.0", 769),
        ("tls1.1", "tls1.1", 770),
        ("TLS1.2", "tls1.2", 771),
        ("tls1.3", "tls1.3", 772),
        ("", "tls1.0", 769),
    ],
)
def test_tls_min_version(text: str, name: str, code: int) -> None:
    opts = nsqd(f"--tls-min-version={text}")
    assert opts.tls_min_version == name
    assert opts.tls_min_version_code == code
    ref = option_by_cfg_name(opts, "tls_min_version")
    assert ref is not None and ref.go_value == code


@pytest.mark.parametrize("text", ["ssl3.0", "tls1.4", "1.2"])
def test_tls_min_version_rejects_others(text: str) -> None:
    with pytest.raises(FlagError) as info:
        nsqd(f"--tls-min-version={text}")
    assert str(info.value) == (
        f'invalid value "{text}" for flag -tls-min-version: unknown tlsVersionOption "{text}"'
    )


def test_e2e_percentiles_repeated_and_comma_listed_sorted_descending() -> None:
    opts = nsqd(
        "--e2e-processing-latency-percentile=0.5",
        "--e2e-processing-latency-percentile=1.0,0.99",
        "--e2e-processing-latency-percentile",
        "0.95",
    )
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.99, 0.95, 0.5]


def test_enable_experiment_and_topology() -> None:
    opts = nsqd(
        f"--enable-experiment={TOPOLOGY_AWARE_CONSUMPTION}",
        "--topology-zone=z1",
        "--topology-region=r1",
    )
    assert opts.has_experiment(TOPOLOGY_AWARE_CONSUMPTION)
    assert (opts.topology_zone, opts.topology_region) == ("z1", "r1")


# ------------------------------------------------------------------ config file


def test_config_file_with_nsqd_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text(
        """
id = 42
log_level = "warn"
tcp_address = "127.0.0.1:5150"
nsqlookupd_tcp_addresses = ["a:4160", "b:4160"]
auth_http_addresses = ["auth:4181"]
e2e_processing_latency_percentiles = [0.5, 1.0, 0.99]
enable_experiment = ["topology-aware-consumption"]
msg_timeout = "30s"
max_req_timeout = 5000
snappy = false
tls_required = "tcp-https"
tls_min_version = "tls1.2"
statsd_prefix = "nsq.%s"
unknown_option = "ignored"
"""
    )
    result = parse_nsqd_args([f"--config={cfg}", "--tcp-address=0.0.0.0:6150"])
    opts = result.options
    assert opts.node_id == 42
    assert opts.log_level is LogLevel.WARN
    assert opts.tcp_address == "0.0.0.0:6150"
    assert result.is_explicit("tcp_address")
    assert opts.lookupd_tcp_addresses == ["a:4160", "b:4160"]
    assert opts.auth_http_addresses == ["auth:4181"]
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.99, 0.5]
    assert opts.experiments == [TOPOLOGY_AWARE_CONSUMPTION]
    assert opts.msg_timeout == 30.0
    assert opts.max_req_timeout == 5.0
    assert opts.snappy is False
    assert opts.tls_required is TLSRequired.EXCEPT_HTTP
    assert opts.tls_min_version == "tls1.2"
    assert opts.http_address == "0.0.0.0:4151"


def test_config_tls_required_as_toml_bool(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text("tls_required = true\n")
    assert nsqd(f"--config={cfg}").tls_required is TLSRequired.REQUIRED


def test_config_flag_names_are_not_config_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('node_id = 5\nlookupd_tcp_address = ["x:1"]\nverbose = true\n')
    opts = nsqd(f"--config={cfg}")
    assert opts.node_id == default_node_id()
    assert opts.lookupd_tcp_addresses == []
    assert opts.verbose is False


def test_config_bad_values(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('tls_min_version = "ssl3.0"\n')
    with pytest.raises(ConfigError, match=r'unknown tlsVersionOption "ssl3\.0"'):
        nsqd(f"--config={cfg}")
    cfg.write_text('mem_queue_size = "lots"\n')
    with pytest.raises(ConfigError, match="for mem_queue_size"):
        nsqd(f"--config={cfg}")


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^failed to load config file "):
        nsqd(f"--config={tmp_path / 'missing.cfg'}")


# ------------------------------------------------------------------ /config lookup


def test_option_by_cfg_name_for_nsqd() -> None:
    opts = Options(node_id=3, lookupd_tcp_addresses=["a:1"])
    node = option_by_cfg_name(opts, "id")
    assert node is not None and node.value == 3 and node.spec.name == "node-id"
    timeout = option_by_cfg_name(opts, "msg_timeout")
    assert timeout is not None and timeout.go_value == 60_000_000_000
    buffer = option_by_cfg_name(opts, "output_buffer_timeout")
    assert buffer is not None and buffer.go_value == 250_000_000
    level = option_by_cfg_name(opts, "log_level")
    assert level is not None and level.go_value == 2
    tls = option_by_cfg_name(opts, "tls_required")
    assert tls is not None and tls.go_value == 0
    lookupd = option_by_cfg_name(opts, "nsqlookupd_tcp_addresses")
    assert lookupd is not None and lookupd.go_value == ["a:1"]
    assert option_by_cfg_name(opts, "node_id") is None
    assert option_by_cfg_name(opts, "verbose") is None


# ------------------------------------------------------------------ validation


def test_defaults_validate() -> None:
    opts = valid()
    assert opts.tls_required is TLSRequired.NOT_REQUIRED


@pytest.mark.parametrize("node_id", [-1, 1024, 5000])
def test_node_id_range(node_id: int) -> None:
    invalid("--node-id must be [0,1024)", node_id=node_id)


@pytest.mark.parametrize("node_id", [0, 1023])
def test_node_id_bounds_ok(node_id: int) -> None:
    assert valid(node_id=node_id).node_id == node_id


@pytest.mark.parametrize("workers", [0, -1, 257])
def test_workers_range(workers: int) -> None:
    invalid("--workers must be [1,256]", workers=workers)


@pytest.mark.parametrize("window", [-0.000001, 0.0100001, 1.0])
def test_idle_poll_range(window: float) -> None:
    invalid("--idle-poll must be [0,10ms]", idle_poll=window)


@pytest.mark.parametrize("window", [0.0, 0.01])
def test_idle_poll_bounds_ok(window: float) -> None:
    assert valid(idle_poll=window).idle_poll == window


@pytest.mark.parametrize("level", [0, 10])
def test_max_deflate_level_range(level: int) -> None:
    invalid("--max-deflate-level must be [1,9]", max_deflate_level=level)


@pytest.mark.parametrize("level", [1, 9])
def test_max_deflate_level_bounds_ok(level: int) -> None:
    assert valid(max_deflate_level=level).max_deflate_level == level


def test_tls_required_without_cert_and_key() -> None:
    message = "cannot require TLS client connections without TLS key and cert"
    invalid(message, tls_required=TLSRequired.REQUIRED)
    invalid(message, tls_required=TLSRequired.EXCEPT_HTTP)
    assert valid(tls_required=TLSRequired.REQUIRED, tls_cert="c.pem", tls_key="k.pem")


@pytest.mark.parametrize("policy", ["require", "require-verify"])
def test_client_auth_policy_forces_tls_required(policy: str) -> None:
    opts = valid(tls_client_auth_policy=policy, tls_cert="c.pem", tls_key="k.pem")
    assert opts.tls_required is TLSRequired.REQUIRED
    invalid(
        "cannot require TLS client connections without TLS key and cert",
        tls_client_auth_policy=policy,
    )


def test_client_auth_policy_keeps_tcp_https() -> None:
    opts = valid(
        tls_client_auth_policy="require",
        tls_required=TLSRequired.EXCEPT_HTTP,
        tls_cert="c.pem",
        tls_key="k.pem",
    )
    assert opts.tls_required is TLSRequired.EXCEPT_HTTP


def test_tls_min_version_validated() -> None:
    invalid('unknown tlsVersionOption "ssl3.0"', tls_min_version="ssl3.0")


@pytest.mark.parametrize("method", ["GET", "put", ""])
def test_auth_http_request_method(method: str) -> None:
    invalid("--auth-http-request-method must be post or get", auth_http_request_method=method)


def test_auth_http_request_method_post_ok() -> None:
    assert valid(auth_http_request_method="post").auth_http_request_method == "post"


@pytest.mark.parametrize(("value", "text"), [(0.0, "0"), (1.5, "1.5"), (-0.5, "-0.5"), (2.0, "2")])
def test_e2e_percentile_range(value: float, text: str) -> None:
    invalid(
        f"invalid E2E processing latency percentile: {text}",
        e2e_processing_latency_percentiles=[0.5, value],
    )


def test_e2e_percentiles_sorted_by_validate() -> None:
    opts = Options()
    opts.e2e_processing_latency_percentiles = [0.5, 1.0, 0.75]
    validate(opts)
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.75, 0.5]


def test_e2e_percentile_from_command_line_validated() -> None:
    opts = nsqd("--e2e-processing-latency-percentile=1.5")
    with pytest.raises(OptionsError, match=r"^invalid E2E processing latency percentile: 1\.5$"):
        validate(opts)


def test_unknown_experiment() -> None:
    invalid(
        "invalid --enable-experiment \"warp-drive\" (valid: 'topology-aware-consumption')",
        experiments=["warp-drive"],
    )
    assert valid(experiments=[TOPOLOGY_AWARE_CONSUMPTION])


def test_log_level_validated_when_set_programmatically() -> None:
    assert valid(log_level=3).log_level is LogLevel.WARN
    invalid("invalid log level '9'", log_level=9)


def test_tls_versions_table() -> None:
    assert TLS_VERSIONS == {"tls1.0": 769, "tls1.1": 770, "tls1.2": 771, "tls1.3": 772}
