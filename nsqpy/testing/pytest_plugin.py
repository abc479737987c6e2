"""The pytest plugin: real nsqd and nsqlookupd as fixtures.

Registered through the ``pytest11`` entry point, so installing nsqpy is enough::

    def test_roundtrip(nsqd):                      # an nsqd on 127.0.0.1, port 0
        nsqd.pub("events", b"hello")
        assert nsqd.depth("events") == 1

Fixtures (objects of :mod:`nsqpy.testing`):

``nsqd``            an :class:`~nsqpy.testing.NSQD`; flags by indirect parametrisation:
                    ``@pytest.mark.parametrize("nsqd", [{"mem_queue_size": 0}], indirect=True)``
``nsqlookupd``      an :class:`~nsqpy.testing.NSQLookupd`
``nsq_cluster``     an :class:`~nsqpy.testing.NSQCluster`: nsqlookupd and N nsqd registered
                    with it; parametrise with N or ``{"nsqd_count": 3, "nsqd_flags": {...}}``
``nsqd_factory``    ``nsqd_factory(tls=True, mem_queue_size=0, ...)`` starts more nsqd

ini options (``pytest.ini``, ``[tool.pytest.ini_options]``, or ``-o name=value``):

``nsqpy_fixture_scope``     scope of the four fixtures (default ``function``; ``module`` or
                            ``session`` share servers between tests)
``nsqpy_nsqd_flags``        flags for every nsqd, e.g. ``--mem-queue-size=0 --msg-timeout=5s``
``nsqpy_nsqlookupd_flags``  flags for every nsqlookupd
``nsqpy_cluster_size``      nsqd in ``nsq_cluster`` (default 2)
``nsqpy_start_timeout``     seconds a server may take to start (default 15)

Per-test flags win over ini flags, which win over the defaults. Every server is stopped,
and its directory removed, when its fixture's scope ends.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any, Literal, cast

import pytest

from nsqpy.testing._process import parse_flag_args
from nsqpy.testing._servers import NSQD, NSQCluster, NSQLookupd, _Server

__all__ = [
    "nsq_cluster",
    "nsqd",
    "nsqd_factory",
    "nsqlookupd",
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_makereport",
]

_LOG_TAIL = 40

Scope = Literal["session", "package", "module", "class", "function"]
_SCOPES = ("session", "package", "module", "class", "function")


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``nsqpy_*`` ini options."""
    parser.addini(
        "nsqpy_fixture_scope",
        "scope of the nsqd, nsqlookupd, nsq_cluster and nsqd_factory fixtures",
        default="function",
    )
    parser.addini(
        "nsqpy_nsqd_flags", "flags for every nsqd (--name=value ...)", type="args", default=[]
    )
    parser.addini("nsqpy_nsqlookupd_flags", "flags for every nsqlookupd", type="args", default=[])
    parser.addini("nsqpy_cluster_size", "nsqd in the nsq_cluster fixture", default="2")
    parser.addini("nsqpy_start_timeout", "seconds an NSQ server may take to start", default="15")


def pytest_configure(config: pytest.Config) -> None:
    """Reject a bad ini option before any test runs."""
    _scope("nsqd", config)
    for name in ("nsqpy_nsqd_flags", "nsqpy_nsqlookupd_flags"):
        _ini_flags(config, name)
    for name in ("nsqpy_cluster_size", "nsqpy_start_timeout"):
        _ini_number(config, name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, None, None]:
    """A failed test's report ends with the last log lines of the servers it used."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        servers: list[_Server] = []
        if isinstance(value, _Server):
            servers = [value]
        elif isinstance(value, NSQCluster):
            servers = [value.lookupd, *value.nsqds]
        for i, server in enumerate(servers):
            if server.process is not None:
                tail = server.process.log_lines[-_LOG_TAIL:]
                label = name if len(servers) == 1 else f"{name} {server.name} {i}"
                report.sections.append((f"{label} log (pid {server.pid})", "\n".join(tail)))


def _scope(fixture_name: str, config: pytest.Config) -> Scope:
    scope = str(config.getini("nsqpy_fixture_scope")).strip()
    if scope not in _SCOPES:
        raise pytest.UsageError(
            f"nsqpy_fixture_scope = {scope!r}: expected one of {', '.join(_SCOPES)}"
        )
    return cast(Scope, scope)


def _ini_flags(config: pytest.Config, name: str) -> dict[str, object]:
    try:
        return parse_flag_args(cast(list[str], config.getini(name)))
    except ValueError as err:
        raise pytest.UsageError(f"{name}: {err}") from None


def _ini_number(config: pytest.Config, name: str) -> float:
    text = str(config.getini(name)).strip()
    try:
        value = float(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise pytest.UsageError(f"{name} = {text!r}: expected a positive number")
    return value


def _param(request: pytest.FixtureRequest) -> Any:
    return getattr(request, "param", None)


def _param_flags(request: pytest.FixtureRequest, fixture: str) -> dict[str, Any]:
    param = _param(request)
    if param is None:
        return {}
    if not isinstance(param, dict):
        raise pytest.UsageError(f"{fixture}: parametrise with a dict of flags, not {param!r}")
    return param


def _nsqd_kwargs(config: pytest.Config, flags: dict[str, Any]) -> dict[str, Any]:
    return {
        "timeout": _ini_number(config, "nsqpy_start_timeout"),
        **_ini_flags(config, "nsqpy_nsqd_flags"),
        **flags,
    }


@pytest.fixture(scope=_scope)
def nsqd_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., NSQD]]:
    """``nsqd_factory(**flags)`` starts an nsqd (``tls=True`` for a certificate); all are
    stopped when the fixture's scope ends."""
    started: list[NSQD] = []

    def start(*args: str, **flags: Any) -> NSQD:
        server = NSQD(*args, **_nsqd_kwargs(request.config, flags))
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.close()


@pytest.fixture(scope=_scope)
def nsqd(request: pytest.FixtureRequest) -> Iterator[NSQD]:
    """An nsqd on 127.0.0.1; flags from ``nsqpy_nsqd_flags`` and indirect parametrisation."""
    with NSQD(**_nsqd_kwargs(request.config, _param_flags(request, "nsqd"))) as server:
        yield server


@pytest.fixture(scope=_scope)
def nsqlookupd(request: pytest.FixtureRequest) -> Iterator[NSQLookupd]:
    """An nsqlookupd on 127.0.0.1; flags from ``nsqpy_nsqlookupd_flags`` and parametrisation."""
    flags: dict[str, Any] = {
        "timeout": _ini_number(request.config, "nsqpy_start_timeout"),
        **_ini_flags(request.config, "nsqpy_nsqlookupd_flags"),
        **_param_flags(request, "nsqlookupd"),
    }
    with NSQLookupd(**flags) as server:
        yield server


@pytest.fixture(scope=_scope)
def nsq_cluster(request: pytest.FixtureRequest) -> Iterator[NSQCluster]:
    """nsqlookupd and ``nsqpy_cluster_size`` nsqd registered with it.

    Parametrise with a count, or a dict of :class:`~nsqpy.testing.NSQCluster`'s
    arguments (``nsqd_count``, ``nsqd_flags``, ``lookupd_flags``).
    """
    config = request.config
    param = _param(request)
    spec: dict[str, Any] = {"nsqd_count": int(_ini_number(config, "nsqpy_cluster_size"))}
    if isinstance(param, int):
        spec["nsqd_count"] = param
    elif isinstance(param, dict):
        spec.update(param)
    elif param is not None:
        raise pytest.UsageError(f"nsq_cluster: parametrise with a count or a dict, not {param!r}")
    timeout = _ini_number(config, "nsqpy_start_timeout")
    cluster = NSQCluster(
        int(spec.pop("nsqd_count")),
        nsqd_flags={**_ini_flags(config, "nsqpy_nsqd_flags"), **spec.pop("nsqd_flags", {})},
        lookupd_flags={
            **_ini_flags(config, "nsqpy_nsqlookupd_flags"),
            **spec.pop("lookupd_flags", {}),
        },
        timeout=timeout,
    )
    if spec:
        raise pytest.UsageError(f"nsq_cluster: unknown parameters {sorted(spec)}")
    with cluster:
        yield cluster
