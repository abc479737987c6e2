"""Differential tests: the same traffic at Go's nsqd and at nsqpy's, the answers compared.

Go's binaries (built from NSQ master) are in ``<repo root>/../shared/ref/nsq-go/``
(``NSQPY_GO_NSQ_DIR`` points elsewhere). Without them the tests skip, except in CI
(``CI=true``), where they fail: a differential suite that did not run proved nothing.

What runs
    Each module starts one Go nsqd and one nsqpy nsqd with the same flags
    (:data:`harness.NSQD_FLAGS`: ``--max-msg-size=1024``, ``--max-body-size=4096``, ... so
    that max and max+1 are cheap), each with its own data directory, on 127.0.0.1 port 0,
    through nsqpy.testing's server machinery (:class:`harness.GoNSQD` is its ``NSQD`` with
    Go's binary as the command). Tests whose divergence would leave the two servers in
    different states take a pair of their own (``fresh_pair``).

    ``test_tcp_fixed.py``       TCP V2: every name and size edge case, pipelined and split
                                commands, after IDENTIFY/AUTH, pinned divergences
    ``test_tcp_generated.py``   generated TCP scripts (four mixes of commands)
    ``test_consumer.py``        generated consumer sessions: SUB, RDY, FIN/REQ/TOUCH, pause
    ``test_http.py``            the HTTP API: routes, methods, bodies, the same head again
                                and again on a kept-alive connection, Expect: 100-continue,
                                generated requests
    ``test_lookupd.py``         both nsqd registered with a Go nsqlookupd: what it learns
                                from each, and a new topic taking the channels it holds
    ``test_disk_queue.py``      generated scripts and sessions with --mem-queue-size=0

What is compared
    TCP: the frames that come back on one connection (type and data; a message without
    its ID and timestamp) and whether nsqd closed it; the script half-closes after its
    last byte, so nsqd's close ends the transcript (no timer). HTTP: status line, the
    headers that carry meaning (Content-Type, X-NSQ-Content-Type, Allow, Connection), the
    body (JSON parsed), and 1xx interim replies. After each case: ``/stats?format=json``
    reduced to the keys Go's nsqd has (:func:`harness.norm_stats`), polled until both
    agree or 2 s pass, since Go fills a new channel and forgets a closed client
    asynchronously. A topic found different is left out of later comparisons in the
    module (:class:`harness.StatsWatch`), so that one divergence is reported once.
    Left out: nsqpy's extras (peek, policies, /metrics, its extra /stats fields, deferrals
    kept across restarts) and what Go answers nondeterministically (IDs, timestamps,
    addresses, ports, memory, start times; which of two consumers gets a message: there
    totals and sets are compared).

Generated cases
    Each generated test has a fixed seed (``test_generated_scripts[publish]``: 7101,
    ``[consumer]``: 7102, ``[identify_auth]``: 7103, ``[mixed]``: 7104; consumer sessions:
    7201; HTTP requests: 7301; registrations: 7401; disk queue: 7501 and 7502), so every
    run sends the same bytes. A divergence is reported with its seed, its case number and
    the bytes sent (runs of one byte shown as ``<Nxc>``), e.g.::

        seed 7101 case 4: pieces [b'  V2MPUB p7101_4_1\n\x00\x00\x00\x08...']

    Reproduce it with that seed and test; ``NSQPY_DIFF_EXAMPLES`` runs more (or fewer)
    cases, another ``NSQPY_DIFF_SEED`` explores further::

        NSQPY_DIFF_SEED=7101 NSQPY_DIFF_EXAMPLES=400 .venv/bin/python -m pytest -q \
            -p no:cacheprovider "tests/differential/test_tcp_generated.py::test_generated_scripts[publish]"

    Cases run in order on the module's servers (later cases see the state earlier ones
    left), so reproduce with the whole seed, not one case alone.

Fixed examples
    Every divergence found is pinned as a plain test with the exact bytes, next to its
    kind, its name or docstring saying "found" or "known": ``test_tcp_fixed.py`` (empty
    topic names on the quick publish path; MPUB creating its topic before reading a bad
    body), ``test_http.py`` (``POST /pub?topic=`` after TCP made topic ""; ``Expect:
    100-continue``; the config options Go fills in with its ports), ``test_consumer.py``
    (the topology counters in /stats) and ``test_lookupd.py`` (staying registered after
    ``PUB \\n``). They must keep passing once fixed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.differential.harness import GoNSQLookupd, Pair, close_all, require_go, start_pair


def _pair() -> Iterator[Pair]:
    require_go("nsqd")
    servers = start_pair()
    try:
        yield servers
    finally:
        close_all(servers.go, servers.py)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """Go's nsqd and nsqpy's, same flags, shared by the module's tests."""
    yield from _pair()


@pytest.fixture
def fresh_pair() -> Iterator[Pair]:
    """A pair for one test: for cases whose divergence would leave the module's servers
    in different states."""
    yield from _pair()


@pytest.fixture(scope="module")
def go_lookupd() -> Iterator[GoNSQLookupd]:
    """Go's nsqlookupd, the one both nsqd register with."""
    require_go("nsqlookupd")
    lookupd = GoNSQLookupd()
    try:
        lookupd.start()
        yield lookupd
    finally:
        close_all(lookupd)
