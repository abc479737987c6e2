"""Suite-wide rules."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, None, None]:
    """In CI (CI=true) every test must run: a skip is reported as a failure, with its reason."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {reason}"


# The tests that share a machine-wide resource within their directory (tests/spark: a Spark
# session and a standalone cluster; tests/faults: mounts, network namespaces, kill -9 timing;
# tests/docs: the docs' Spark cluster and bench commands; tests/browser: Chromium), the longest
# first. Under ``pytest -n 2 --dist loadgroup`` (scripts/test.sh) a directory runs on one
# worker, its tests one at a time in file order, beside another directory. (Two Spark groups
# at once, the standalone cluster's tests beside the rest of tests/spark, slowed both past
# their timeouts.)
_GROUPS = ("spark", "faults", "docs", "browser")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    ranks: dict[int, int] = {}
    for item in items:
        where = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        group = next((g for g in _GROUPS if where == g or where.startswith(g + "/")), None)
        ranks[id(item)] = 0 if group is None else _GROUPS.index(group) + 1
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: ranks[id(item)])  # stable: file order within a group
