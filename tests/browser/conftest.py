"""Fixtures for the browser suite: a real cluster, nsqadmin, and Debian's chromium driven by
Playwright (never ``playwright install``: the system browser is used as it is)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_nsqadmin_api import Cluster

CHROMIUM = os.environ.get("NSQPY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")  # Playwright marks the main thread's loop running while alive
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("nsqadmin-ui"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def new_page(browser: Any) -> Iterator[Any]:
    """``new_page(**context_options)``: a page whose JavaScript errors fail the test."""
    contexts: list[Any] = []
    errors: list[str] = []

    def make(*, expected_errors: tuple[str, ...] = (), **options: Any) -> Any:
        """``expected_errors``: console errors containing one of these are not failures
        (a 403 never is: read-only users are refused on purpose)."""
        allowed = ("403", *expected_errors)
        context = browser.new_context(viewport={"width": 1360, "height": 900}, **options)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.on(
            "console",
            lambda msg: (
                errors.append(msg.text)
                if msg.type == "error" and not any(a in msg.text for a in allowed)
                else None
            ),
        )
        return page

    yield make
    for context in contexts:
        context.close()
    assert errors == [], errors


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the logs of the cluster's servers: a failure seen only
    in CI (an upstream error behind a 502, say) can then be read from its output."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.failed:
        return
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if isinstance(cluster, Cluster):
        for pool in (cluster.admin_pool, cluster.lookupd_pool, cluster.nsqd_pool):
            for server in pool:
                report.sections.append((f"{server!r} log", server.log_text()[-8000:]))


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot to artifacts/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
