"""nsqadmin's flags, config file and startup checks (Go's apps/nsqadmin and nsqadmin.New)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqpy.common.goflags import OptionsError, usage
from nsqpy.common.log import LogLevel
from nsqpy.nsqadmin import app
from nsqpy.nsqadmin.options import (
    Options,
    normalize_base_path,
    parse_nsqadmin_args,
    split_host_port,
    validate,
)


def test_defaults_match_go() -> None:
    opts = parse_nsqadmin_args([]).options
    assert opts.http_address == "0.0.0.0:4171"
    assert opts.base_path == "/"
    assert opts.log_prefix == "[nsqadmin] " and opts.log_level is LogLevel.INFO
    assert opts.statsd_prefix == "nsq.%s"
    assert opts.statsd_counter_format == "stats.counters.%s.count"
    assert opts.statsd_gauge_format == "stats.gauges.%s"
    assert opts.statsd_interval == 60.0
    assert (opts.http_client_connect_timeout, opts.http_client_request_timeout) == (2.0, 5.0)
    assert opts.allow_config_from_cidr == "127.0.0.1/8"
    assert opts.acl_http_header == "X-Forwarded-User"
    assert opts.admin_users == [] and opts.nsqlookupd_http_addresses == []
    assert opts.sample_interval == 5.0


def test_repeatable_flags_and_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqadmin.toml"
    cfg.write_text(
        'nsqlookupd_http_addresses = ["a:4161", "b:4161"]\n'
        'admin_users = ["alice"]\n'
        'notification_http_endpoint = "http://hook/"\n'
        'sample_interval = "2s"\n'
    )
    result = parse_nsqadmin_args(
        [f"--config={cfg}", "--admin-user=bob", "--admin-user", "carol", "-base-path=ui"]
    )
    opts = result.options
    assert opts.nsqlookupd_http_addresses == ["a:4161", "b:4161"]
    assert opts.admin_users == ["bob", "carol"]  # the flag wins over the file
    assert opts.notification_http_endpoint == "http://hook/"
    assert opts.sample_interval == 2.0
    validate(opts)
    assert opts.base_path == "/ui"


@pytest.mark.parametrize(
    ("path", "normal"),
    [("", "/"), ("/", "/"), ("admin", "/admin"), ("/admin/", "/admin"), ("//a//b/../c", "/a/c")],
)
def test_base_path_normalisation(path: str, normal: str) -> None:
    assert normalize_base_path(path) == normal


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "--nsqd-http-address or --lookupd-http-address required"),
        (
            {"nsqd_http_addresses": ["a:1"], "nsqlookupd_http_addresses": ["b:1"]},
            "use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            {"nsqd_http_addresses": ["a:1"], "http_client_tls_cert": "c.pem"},
            "--http-client-tls-key must be specified with --http-client-tls-cert",
        ),
        (
            {"nsqd_http_addresses": ["a:1"], "http_client_tls_key": "k.pem"},
            "--http-client-tls-cert must be specified with --http-client-tls-key",
        ),
        (
            {"nsqd_http_addresses": ["nocolon"]},
            "failed to resolve --nsqd-http-address (nocolon)",
        ),
        (
            {"nsqd_http_addresses": ["a:1"], "allow_config_from_cidr": "10.0.0.1"},
            "failed to parse --allow-config-from-cidr (10.0.0.1)",
        ),
        (
            {"nsqd_http_addresses": ["a:1"], "basic_auth_user": "u"},
            "--basic-auth-user and --basic-auth-password must be given together",
        ),
        (
            {"nsqd_http_addresses": ["a:1"], "sample_interval": 10.0, "history_duration": 5.0},
            "--history-duration must be at least --sample-interval",
        ),
    ],
)
def test_validate_messages(changes: dict[str, object], message: str) -> None:
    opts = Options(**changes)  # type: ignore[arg-type]
    with pytest.raises(OptionsError) as err:
        validate(opts)
    assert str(err.value).startswith(message)


def test_split_host_port() -> None:
    assert split_host_port("127.0.0.1:4171") == ("127.0.0.1", 4171)
    assert split_host_port("[::1]:4171") == ("::1", 4171)
    assert split_host_port(":4171") == ("", 4171)
    for bad in ("4171", "::1:4171", "a:b", "a:99999"):
        with pytest.raises(ValueError):
            split_host_port(bad)


def test_usage_lists_go_flags() -> None:
    text = usage(Options, "nsqadmin")
    for name in (
        "-lookupd-http-address",
        "-admin-user",
        "-acl-http-header",
        "-base-path",
        "-notification-http-endpoint",
        "-allow-config-from-cidr",
        "-sample-interval",
    ):
        assert f"  {name}" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        app.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == "nsqadmin v1.3.0 (built w/nsqpy-0.1.0)\n"


def test_bad_options_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        app.main(["--http-address=127.0.0.1:0"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert (
        "FATAL: failed to instantiate nsqadmin - --nsqd-http-address or --lookupd-http-address required"
        in err
    )
