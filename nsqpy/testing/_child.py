"""``python -m nsqpy.testing._child <module> <args>``: run a server that dies with its parent.

The parent (:class:`nsqpy.testing.NSQD` and friends) gives the child a stdin pipe it
never writes to. When the parent goes away, even by SIGKILL, the pipe's last writer is
gone, stdin reads EOF and the server gets SIGTERM: it exits gracefully and takes its
ports with it. Its directory (``NSQPY_TESTING_DIRECTORY``), which the dead parent can
no longer remove, is removed then.
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import sys
import threading

_orphaned = threading.Event()


def _stop_at_eof() -> None:
    while os.read(0, 4096):
        pass
    _orphaned.set()
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    """Start the stdin watchdog, then run the module given as first argument."""
    module, args = sys.argv[1], sys.argv[2:]
    threading.Thread(target=_stop_at_eof, name="parent-watchdog", daemon=True).start()
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        directory = os.environ.get("NSQPY_TESTING_DIRECTORY")
        if _orphaned.is_set() and directory:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
