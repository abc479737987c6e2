"""A real NSQ for Python test suites: nsqd, nsqlookupd and nsqadmin on free ports.

Outside pytest::

    with nsqpy.testing.NSQD(mem_queue_size=0) as nsqd:       # a process, ready in < 1 s
        nsqd.pub("events", b"hello")
        producer = SomeClient(nsqd.tcp_address)

    async with nsqpy.testing.AsyncNSQD() as nsqd:            # on this event loop, ~10 ms
        ...

With pytest the ``nsqd``, ``nsqlookupd``, ``nsq_cluster`` and ``nsqd_factory`` fixtures
(:mod:`nsqpy.testing.pytest_plugin`, registered through the ``pytest11`` entry point)
give the same objects. Every server listens on ``127.0.0.1`` port 0, keeps its data in a
temporary directory and leaves nothing behind (see docs/TESTING.md). This package
imports neither pytest nor the servers until it needs them.
"""

from nsqpy.testing._http import HTTPError
from nsqpy.testing._inprocess import AsyncNSQD
from nsqpy.testing._process import ServerError, ServerProcess
from nsqpy.testing._servers import NSQD, NSQAdmin, NSQCluster, NSQLookupd
from nsqpy.testing._tls import TLSFiles, make_tls_files

__all__ = [
    "NSQD",
    "AsyncNSQD",
    "HTTPError",
    "NSQAdmin",
    "NSQCluster",
    "NSQLookupd",
    "ServerError",
    "ServerProcess",
    "TLSFiles",
    "make_tls_files",
]
