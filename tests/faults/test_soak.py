"""The soak (bench/soak.py) for one minute: mixed traffic, nothing lost, nothing growing.

The script itself judges (exit 1 on a lost message, a failed publish or a figure that kept
growing after the warm-up); this test runs it as a user would, then checks that it printed a
sample line per interval and its verdict. docs/RELIABILITY.md "A long run" has the hour.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(150)

REPO = Path(__file__).resolve().parents[2]
SAMPLE = re.compile(
    r"^\[soak\] t=\d+s nsqd rss=[\d.]+MiB fds=\d+ tasks=\d+ .* latency p50=[\d.]+ms "
    r"p99=[\d.]+ms \| published=(\d+) received=(\d+)$"
)


def test_one_minute_of_mixed_traffic_loses_nothing_and_grows_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/soak.py", "--duration", "60", "--interval", "5", "--churn", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    samples = [m for line in proc.stdout.splitlines() if (m := SAMPLE.match(line))]
    assert len(samples) >= 10, output
    assert int(samples[-1].group(1)) > 3000, output  # about 110 messages/s were published
    assert "[soak] OK: nothing lost, nothing kept growing" in proc.stdout, output
    assert re.search(r"\b(\d+) temporary topics created, read and deleted; lost: 0;", proc.stdout)
