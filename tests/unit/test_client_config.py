"""nsqpy.client._config: option checks and go-nsq's ``--consumer-opt`` names."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from nsqpy.client._config import (
    ConsumerOptions,
    ProducerOptions,
    apply_go_option,
    resolve,
    tls_context_from_go,
)


def go(*opts: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for opt in opts:
        apply_go_option(options, opt)
    return options


def test_defaults_are_go_nsq_defaults() -> None:
    config = resolve({}, ConsumerOptions)
    assert config.max_in_flight == 1
    assert config.max_attempts == 5
    assert config.heartbeat_interval == 30.0
    assert config.lookupd_poll_interval == 60.0
    assert config.default_requeue_delay == 90.0
    assert config.max_backoff_duration == 120.0
    assert config.rdy_redistribute_interval == 5.0


def test_unknown_and_invalid_options() -> None:
    with pytest.raises(TypeError, match="unknown option"):
        resolve({"max_inflight": 3}, ConsumerOptions)
    with pytest.raises(TypeError, match="unknown option"):
        resolve({"max_in_flight": 3}, ProducerOptions)  # a consumer option
    with pytest.raises(ValueError, match="both deflate and snappy"):
        resolve({"deflate": True, "snappy": True}, ProducerOptions)
    with pytest.raises(ValueError):
        resolve({"sample_rate": 100}, ConsumerOptions)
    with pytest.raises(ValueError):
        resolve({"backoff_strategy": "linear"}, ConsumerOptions)


def test_go_option_names_and_values() -> None:
    assert go("max_in_flight,100", "max_attempts,0") == {"max_in_flight": 100, "max_attempts": 0}
    assert go("lookupd_poll_interval,15s", "msg_timeout,2m30s") == {
        "lookupd_poll_interval": 15.0,
        "msg_timeout": 150.0,
    }
    assert go("heartbeat_interval,-1ns") == {"heartbeat_interval": -1.0}
    assert go("snappy") == {"snappy": True}  # a bare key is true, like go-nsq's ConfigFlag
    assert go("deflate,false", "deflate_level,3") == {"deflate": False, "deflate_level": 3}
    assert go("lookupd_poll_jitter,0.5", "backoff_multiplier,250ms") == {
        "lookupd_poll_jitter": 0.5,
        "backoff_multiplier": 0.25,
    }
    assert go("client_id,worker-1", "auth_secret,a,b") == {
        "client_id": "worker-1",
        "auth_secret": "a,b",
    }
    assert go("write_timeout,1s") == {}  # accepted, nothing to do in asyncio
    resolve(go("max_in_flight,100", "lookupd_poll_interval,15s"), ConsumerOptions)
    with pytest.raises(ValueError, match="invalid option nope"):
        go("nope,1")
    with pytest.raises(ValueError, match="failed to set option max_in_flight"):
        go("max_in_flight,lots")


def test_tls_file_options(tmp_path: Any) -> None:
    tls: dict[str, str] = {}
    options: dict[str, Any] = {}
    apply_go_option(options, "tls_v1,true", tls)
    apply_go_option(options, "tls_insecure_skip_verify,true", tls)
    apply_go_option(options, "tls_min_version,tls1.2", tls)
    assert options == {"tls_v1": True}
    ctx = tls_context_from_go(tls)
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(ValueError):
        tls_context_from_go({"tls_min_version": "tls9"})
