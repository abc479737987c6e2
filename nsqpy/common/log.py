"""Logging in NSQ's format: ``[nsqd] 2026/11/21 17:00:00.000000 INFO: message`` on stderr."""

from __future__ import annotations

import sys
import time
from enum import IntEnum
from typing import TextIO


class LogLevel(IntEnum):
    """NSQ's ``lg.LogLevel``; every NSQ binary has a ``--log-level`` flag of this type."""

    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4
    FATAL = 5

    @classmethod
    def parse(cls, text: str) -> LogLevel:
        """Parse a level name case-insensitively, as ``lg.ParseLogLevel`` does."""
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(
                f"invalid log level '{text}' (debug, info, warn, error, fatal)"
            ) from None

    @property
    def label(self) -> str:
        """The level as written in log lines (``WARN`` is ``WARNING`` there)."""
        return "WARNING" if self is LogLevel.WARN else self.name


Level = LogLevel


class Logger:
    """Writes lines like Go's log package with ``LstdFlags|Lmicroseconds`` and a prefix."""

    __slots__ = ("level", "prefix", "stream")

    def __init__(
        self, prefix: str, level: Level = Level.INFO, stream: TextIO | None = None
    ) -> None:
        self.prefix = prefix
        self.level = level
        self.stream = stream

    def log(self, level: Level, msg: str) -> None:
        if level < self.level:
            return
        now = time.time()
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now))
        micros = int((now % 1) * 1_000_000)
        stream = self.stream or sys.stderr
        try:
            stream.write(f"{self.prefix}{stamp}.{micros:06d} {level.label}: {msg}\n")
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not take the server down

    def debug(self, msg: str) -> None:
        self.log(Level.DEBUG, msg)

    def info(self, msg: str) -> None:
        self.log(Level.INFO, msg)

    def warn(self, msg: str) -> None:
        self.log(Level.WARN, msg)

    def error(self, msg: str) -> None:
        self.log(Level.ERROR, msg)

    def fatal(self, msg: str) -> None:
        self.log(Level.FATAL, msg)
