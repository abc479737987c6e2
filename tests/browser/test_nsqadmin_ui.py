"""nsqadmin's web UI in a real browser (chromium via Playwright) against a real cluster.

Every page is checked for the cluster's real figures and saved as a screenshot under
artifacts/screenshots/; every admin action is clicked through its confirmation dialog and
its effect checked both on the page and on the nsqd / nsqlookupd themselves.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import screenshot
from tests.e2e.test_nsqadmin_api import NSQADMIN, NSQD_WITH_HTTP, Cluster, wait_until
from tests.support.procs import ServerPool, ServerProcess
from tests.support.rawclient import RawClient, consumer

expect.set_options(timeout=10_000)

NewPage = Callable[..., Page]


@pytest.fixture(scope="module")
def traffic(cluster: Cluster) -> Iterator[RawClient]:
    """orders (both nsqd; channels billing + audit; a consumer holding 2 in flight) and clicks."""
    for i in (0, 1):
        cluster.nsqd_post(i, "/topic/create?topic=orders")
        for channel in ("billing", "audit"):
            cluster.nsqd_post(i, f"/channel/create?topic=orders&channel={channel}")
    cluster.publish(0, "orders", 5)
    cluster.publish(1, "orders", 3)
    cluster.publish(1, "clicks", 7)
    cluster.wait_registered("orders", {0, 1}, "billing")
    cluster.wait_registered("clicks", {1})
    client = consumer(
        cluster.nsqd_tcp(0),
        "orders",
        "billing",
        rdy=2,
        user_agent="ui-consumer/2.0",
        hostname="worker-ui",
        heartbeat_interval=60_000,  # the longest allowed: the module may outlive two of 30 s
        msg_timeout=600_000,  # and its two messages in flight
    )
    client.read_messages(2)
    yield client
    client.close()


@pytest.fixture(scope="module")
def admin(cluster: Cluster, traffic: RawClient) -> ServerProcess:
    (process,) = cluster.start_admins({"sample_interval": "300ms", "history_duration": "2m"})
    return process


@pytest.fixture(scope="module")
def acl_admin(cluster: Cluster, traffic: RawClient) -> ServerProcess:
    (process,) = cluster.start_admins(
        {"admin_user": ["alice"], "base_path": "/nsq", "sample_interval": "300ms"}
    )
    return process


def url(process: ServerProcess, path: str = "", prefix: str = "") -> str:
    return f"http://{process.http_address}{prefix}/{path}"


def confirm(page: Page, expected_title: str) -> None:
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".dialog-title")).to_have_text(expected_title)
    dialog.locator('[data-role="confirm"]').click()
    expect(dialog).to_be_hidden()


def row(page: Page, scope: str, attr: str, value: str) -> Any:
    return page.locator(f'{scope} tr[data-{attr}="{value}"]')


# ------------------------------------------------------------------------------ pages


def test_streams_page(admin: ServerProcess, new_page: NewPage) -> None:
    page = new_page()
    page.goto(url(admin))
    expect(page).to_have_title("Streams · nsqadmin")
    expect(page.locator("nav a.active")).to_have_text("Streams")
    orders = row(page, "", "topic", "orders")
    clicks = row(page, "", "topic", "clicks")
    expect(orders.locator("a")).to_have_attribute("href", "topics/orders")
    expect(clicks.locator('[data-col="depth"]')).to_have_text("7")
    expect(orders.locator('[data-col="messages"]')).to_have_text("8")
    expect(orders.locator("svg.spark path")).to_have_count(1)  # a trend after two samples
    screenshot(page, "streams")
    page.get_by_placeholder("Filter topics…").fill("cli")
    expect(orders).to_have_count(0)
    expect(clicks).to_have_count(1)
    clicks.locator("a").click()
    expect(page).to_have_url(url(admin, "topics/clicks"))
    expect(page.locator(".page-title")).to_contain_text("clicks")


def test_a_page_whose_first_load_failed_recovers(cluster: Cluster, new_page: NewPage) -> None:
    # An upstream that does not answer in time fails the page's first load (nsqadmin answers
    # 502); once it answers again, the next refresh shows the page without a reload.
    (admin,) = cluster.start_admins(
        {"sample_interval": "1s", "http_client_request_timeout": "300ms"}
    )
    page = new_page(expected_errors=("502",))
    assert cluster.lookupd is not None
    cluster.lookupd.send_signal(signal.SIGSTOP)
    try:
        page.goto(url(admin))
        expect(page.get_by_role("alert")).to_contain_text("Could not load this page.")
        expect(page.get_by_role("alert")).to_contain_text("UPSTREAM_ERROR")
    finally:
        cluster.lookupd.send_signal(signal.SIGCONT)
    expect(row(page, "", "topic", "orders")).to_have_count(1)
    expect(page.get_by_role("alert")).to_have_count(0)
    expect(page.locator(".page-title")).to_have_text("Streams")
    admin.stop()


def test_topic_page(cluster: Cluster, admin: ServerProcess, new_page: NewPage) -> None:
    page = new_page()
    page.goto(url(admin, "topics/orders"))
    expect(page.locator(".page-title")).to_contain_text("orders")
    expect(page.locator('[data-tile="messages"] .tile-value')).to_have_text("8")
    nodes = page.locator("#topic-nodes tbody tr")
    expect(nodes).to_have_count(2)
    for i, messages in ((0, "5"), (1, "3")):
        node_row = row(page, "#topic-nodes", "node", cluster.nsqd_http(i))
        expect(node_row.locator('[data-col="messages"]')).to_have_text(messages)
    expect(page.locator("#topic-nodes tfoot")).to_contain_text("Total")
    billing = row(page, "#topic-channels", "channel", "billing")
    expect(billing.locator('[data-col="depth"]')).to_have_text("6")
    expect(billing.locator('[data-col="in_flight"]')).to_have_text("2")
    expect(billing.locator('[data-col="messages"]')).to_have_text("8")
    expect(billing.locator('[data-col="connections"]')).to_have_text("1")
    expect(
        row(page, "#topic-channels", "channel", "audit").locator('[data-col="depth"]')
    ).to_have_text("8")
    # the charts draw once two samples exist (a rate needs two)
    expect(page.locator(".chart").first.locator("svg path.line")).to_have_count(1)
    expect(page.locator(".chart").nth(1).locator("svg path.line")).to_have_count(1)
    expect(page.locator(".chart").nth(2).locator("svg path.line")).to_have_count(2)
    expect(page.get_by_role("button", name="Delete Topic")).to_be_visible()
    screenshot(page, "topic")
    page.locator(".chart-plot").nth(1).hover()
    expect(page.locator(".chart-tip").nth(1)).to_be_visible()


def test_channel_page(cluster: Cluster, admin: ServerProcess, new_page: NewPage) -> None:
    page = new_page()
    page.goto(url(admin, "topics/orders"))
    row(page, "#topic-channels", "channel", "billing").locator("a").click()
    expect(page).to_have_url(url(admin, "topics/orders/billing"))
    expect(page.locator('[data-tile="in_flight"] .tile-value')).to_have_text("2")
    expect(page.locator('[data-tile="depth"] .tile-value')).to_have_text("6")
    expect(page.locator('[data-tile="connections"] .tile-value')).to_have_text("1")
    # Go master's delivery counters: without the topology experiment every delivery is global
    expect(page.locator('[data-tile="locality"] .tile-value')).to_have_text("0 / 0 / 2")
    expect(page.locator("#channel-nodes tbody tr")).to_have_count(2)
    client = page.locator("#channel-clients tbody tr")
    expect(client).to_have_count(1)
    expect(client).to_contain_text("worker-ui")
    expect(client).to_contain_text("ui-consumer/2.0")
    expect(client).to_contain_text(cluster.nsqd_http(0))
    expect(client.locator('[data-col="in_flight"]')).to_have_text("2")
    expect(client.locator('[data-col="ready"]')).to_have_text("2")
    expect(page.locator(".chart svg path.line").first).to_be_attached()
    expect(page.locator(".crumbs a")).to_have_text(["Streams", "orders"])
    screenshot(page, "channel")


def test_nodes_and_node_pages(cluster: Cluster, admin: ServerProcess, new_page: NewPage) -> None:
    page = new_page()
    page.goto(url(admin, "nodes"))
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(2)
    for i in (0, 1):
        node_row = row(page, "", "node", cluster.nsqd_http(i))
        expect(node_row).to_contain_text(cluster.nsqd_http(i).rsplit(":", 1)[1])
        expect(node_row.locator(".chip", has_text="orders")).to_have_count(1)
    expect(
        row(page, "", "node", cluster.nsqd_http(1)).locator(".chip", has_text="clicks")
    ).to_have_count(1)
    screenshot(page, "nodes")
    row(page, "", "node", cluster.nsqd_http(0)).locator("a").first.click()
    expect(page).to_have_url(url(admin, f"nodes/{cluster.nsqd_http(0)}"))
    expect(page.locator('[data-tile="clients"] .tile-value')).to_have_text("1")
    expect(page.locator('#node-topics tr[data-topic="orders"] [data-col="messages"]')).to_have_text(
        "5"
    )
    expect(page.locator('#node-topics tr[data-channel="orders/billing"]')).to_have_count(1)
    expect(page.locator("#node-clients tbody tr")).to_contain_text("worker-ui")
    expect(page.locator("#node-memory")).to_contain_text("GC runs")
    expect(page.locator(".chart svg path.line").first).to_be_attached()
    screenshot(page, "node")


def test_counter_page(admin: ServerProcess, new_page: NewPage) -> None:
    page = new_page()
    page.goto(url(admin, "counter"))
    total = page.locator('[data-role="total"]')
    expect(total).to_have_attribute("data-value", re.compile(r"^\d+$"))
    value = int(total.get_attribute("data-value") or "0")
    assert value >= 16  # billing 8 + audit 8 (clicks has no channel)
    expect(total).to_have_text(f"{value:,}")
    expect(page.locator('[data-role="rate"]')).to_contain_text("/s")
    screenshot(page, "counter")


# ------------------------------------------------------------------------------ actions


def test_lookup_create_and_delete_inactive(
    cluster: Cluster, admin: ServerProcess, new_page: NewPage
) -> None:
    page = new_page()
    page.goto(url(admin, "lookup"))
    expect(page.locator(".list li")).to_have_text([cluster.lookupd_http])
    page.locator('input[name="topic"]').fill("fresh_ui")
    page.locator('input[name="channel"]').fill("ch1")
    page.get_by_role("button", name="Create").click()
    expect(page.locator(".flash-success", has_text="Created fresh_ui/ch1")).to_be_visible()
    inactive = page.locator('#inactive li[data-topic="fresh_ui"]')
    expect(inactive.locator('li[data-channel="ch1"]')).to_have_count(1)
    assert "ch1" in cluster.lookupd_get("/channels?topic=fresh_ui")["channels"]
    screenshot(page, "lookup")
    inactive.locator('li[data-channel="ch1"] button').click()
    confirm(page, "Delete channel")
    expect(inactive.locator('li[data-channel="ch1"]')).to_have_count(0)
    assert cluster.lookupd_get("/channels?topic=fresh_ui")["channels"] == []
    inactive.locator(".tree-row button").first.click()
    confirm(page, "Delete topic")
    expect(inactive).to_have_count(0)
    assert "fresh_ui" not in cluster.lookupd_get("/topics")["topics"]


def _nsqd_paused(cluster: Cluster, topic: str, channel: str = "") -> list[bool]:
    out = []
    for i in (0, 1):
        t = cluster.nsqd_topic(i, topic)
        assert t is not None
        if channel:
            (c,) = [c for c in t["channels"] if c["channel_name"] == channel]
            out.append(c["paused"])
        else:
            out.append(t["paused"])
    return out


def test_topic_actions(cluster: Cluster, admin: ServerProcess, new_page: NewPage) -> None:
    for i in (0, 1):
        cluster.publish(i, "acts", 2)  # no channel: the messages stay on the topic
    cluster.wait_registered("acts", {0, 1})
    page = new_page()
    page.goto(url(admin, "topics/acts"))
    depth = page.locator('[data-tile="depth"] .tile-value')
    expect(depth).to_have_text("4")

    page.get_by_role("button", name="Pause", exact=True).click()
    page.locator('#confirm-dialog [data-role="cancel"]').click()  # cancelled: nothing happens
    expect(page.locator(".page-title .badge")).to_have_count(0)
    assert _nsqd_paused(cluster, "acts") == [False, False]

    page.get_by_role("button", name="Pause", exact=True).click()
    confirm(page, "Pause topic")
    expect(page.locator(".page-title .badge", has_text="paused")).to_be_visible()
    assert _nsqd_paused(cluster, "acts") == [True, True]
    page.get_by_role("button", name="Unpause", exact=True).click()
    confirm(page, "Unpause topic")
    expect(page.get_by_role("button", name="Pause", exact=True)).to_be_visible()
    assert _nsqd_paused(cluster, "acts") == [False, False]

    page.get_by_role("button", name="Empty Queue").click()
    confirm(page, "Empty topic")
    expect(depth).to_have_text("0")
    assert [cluster.nsqd_topic(i, "acts")["depth"] for i in (0, 1)] == [0, 0]  # type: ignore[index]

    page.get_by_role("button", name="Delete Topic").click()
    confirm(page, "Delete topic")
    expect(page).to_have_url(url(admin))
    expect(page.locator(".flash-success", has_text="Topic acts deleted")).to_be_visible()
    expect(row(page, "", "topic", "orders")).to_have_count(1)
    expect(row(page, "", "topic", "acts")).to_have_count(0)
    assert cluster.nsqd_topic(0, "acts") is None and cluster.nsqd_topic(1, "acts") is None
    assert "acts" not in cluster.lookupd_get("/topics")["topics"]


def test_channel_actions(cluster: Cluster, admin: ServerProcess, new_page: NewPage) -> None:
    for i in (0, 1):
        cluster.nsqd_post(i, "/topic/create?topic=chacts")
        cluster.nsqd_post(i, "/channel/create?topic=chacts&channel=c")
        cluster.publish(i, "chacts", 3)
    cluster.wait_registered("chacts", {0, 1}, "c")
    page = new_page()
    page.goto(url(admin, "topics/chacts/c"))
    depth = page.locator('[data-tile="depth"] .tile-value')
    expect(depth).to_have_text("6")
    page.get_by_role("button", name="Pause", exact=True).click()
    confirm(page, "Pause channel")
    expect(page.locator(".page-title .badge", has_text="paused")).to_be_visible()
    assert _nsqd_paused(cluster, "chacts", "c") == [True, True]
    page.get_by_role("button", name="Unpause", exact=True).click()
    confirm(page, "Unpause channel")
    expect(page.get_by_role("button", name="Pause", exact=True)).to_be_visible()
    assert _nsqd_paused(cluster, "chacts", "c") == [False, False]
    page.get_by_role("button", name="Empty Queue").click()
    confirm(page, "Empty channel")
    expect(depth).to_have_text("0")
    page.get_by_role("button", name="Delete Channel").click()
    confirm(page, "Delete channel")
    expect(page).to_have_url(url(admin, "topics/chacts"))
    expect(page.locator("#topic-channels .empty")).to_be_visible()
    assert cluster.nsqd_topic(0, "chacts")["channels"] == []  # type: ignore[index]
    assert cluster.lookupd_get("/channels?topic=chacts")["channels"] == []


def test_channel_policy(cluster: Cluster, admin: ServerProcess, new_page: NewPage) -> None:
    """Message policies (docs/POLICIES.md): set through the dialog on every nsqd, shown with
    its counters, cleared; the dead-letter topic's page links back to the channel."""
    for i in (0, 1):
        cluster.nsqd_post(i, "/topic/create?topic=pol")
        cluster.nsqd_post(i, "/channel/create?topic=pol&channel=c")
        cluster.publish(i, "pol", 3)
    cluster.wait_registered("pol", {0, 1}, "c")
    page = new_page()
    page.goto(url(admin, "topics/pol/c"))
    page.get_by_role("button", name="Set Policy").click()
    dialog = page.locator("#confirm-dialog")
    dialog.locator('input[name="max_depth"]').fill("1")
    dialog.locator('input[name="dead_letter_topic"]').fill("pol_dead")
    confirm(page, "Set message policy")
    card = page.locator("#channel-policy")
    expect(card.locator("a", has_text="pol_dead")).to_be_visible()
    # the policy trimmed each nsqd's queue to 1: two dead letters on each
    expect(card.locator('[data-col="overflow_count"]')).to_have_text("4")
    for i in (0, 1):
        t = cluster.nsqd_topic(i, "pol")
        assert t is not None and t["channels"][0]["policy"]["max_depth"] == 1
    card.locator("a", has_text="pol_dead").click()
    expect(page).to_have_url(url(admin, "topics/pol_dead"))
    expect(page.locator("#topic-policy a", has_text="pol/c")).to_be_visible()
    screenshot(page, "policy-dead-letter-topic")

    page.goto(url(admin, "topics/pol/c"))
    page.get_by_role("button", name="Clear Policy").click()
    confirm(page, "Clear message policy")
    expect(page.get_by_role("button", name="Clear Policy")).to_have_count(0)
    for i in (0, 1):
        t = cluster.nsqd_topic(i, "pol")
        assert t is not None and "policy" not in t["channels"][0]


def test_tombstone_a_producer(cluster: Cluster, admin: ServerProcess, new_page: NewPage) -> None:
    for i in (0, 1):
        cluster.publish(i, "tomb", 1)
    cluster.wait_registered("tomb", {0, 1})
    page = new_page()
    page.goto(url(admin, "topics/tomb"))
    expect(page.locator("#topic-nodes tbody tr")).to_have_count(2)
    row(page, "#topic-nodes", "node", cluster.nsqd_http(1)).get_by_role(
        "button", name="Tombstone"
    ).click()
    confirm(page, "Tombstone topic producer")
    expect(page.locator("#topic-nodes tbody tr")).to_have_count(1)
    expect(row(page, "#topic-nodes", "node", cluster.nsqd_http(0))).to_have_count(1)
    assert cluster.producers("tomb") == {cluster.nsqd_http(0)}
    assert cluster.nsqd_topic(1, "tomb") is None


# ------------------------------------------------------------------------------ base path, ACL


def test_base_path_and_read_only_user(
    cluster: Cluster, acl_admin: ServerProcess, new_page: NewPage
) -> None:
    page = new_page()
    page.goto(url(acl_admin, "", "/nsq"))
    expect(page.locator("#user-badge")).to_have_text("read-only")
    row(page, "", "topic", "orders").locator("a").click()
    expect(page).to_have_url(url(acl_admin, "topics/orders", "/nsq"))
    expect(page.locator('[data-tile="messages"] .tile-value')).to_have_text("8")
    expect(page.locator(".page-actions")).to_have_count(0)
    expect(page.get_by_role("button", name="Tombstone")).to_have_count(0)
    screenshot(page, "topic_read_only")
    status = page.evaluate(
        """async () => (await fetch('api/topics/orders', {method: 'POST',
             body: JSON.stringify({action: 'pause'})})).status"""
    )
    assert status == 403
    assert _nsqd_paused(cluster, "orders") == [False, False]
    page.goto(url(acl_admin, "lookup", "/nsq"))
    expect(page.locator(".page-title")).to_have_text("Lookup")
    expect(page.locator('form[data-role="create"]')).to_have_count(0)

    alice = new_page(extra_http_headers={"X-Forwarded-User": "alice"})
    alice.goto(url(acl_admin, "topics/orders", "/nsq"))
    expect(alice.locator("#user-badge")).to_have_text("alice")
    alice.get_by_role("button", name="Pause", exact=True).click()
    confirm(alice, "Pause topic")
    expect(alice.get_by_role("button", name="Unpause", exact=True)).to_be_visible()
    assert _nsqd_paused(cluster, "orders") == [True, True]
    alice.get_by_role("button", name="Unpause", exact=True).click()
    confirm(alice, "Unpause topic")
    expect(alice.get_by_role("button", name="Pause", exact=True)).to_be_visible()
    wait_until(lambda: _nsqd_paused(cluster, "orders") == [False, False])


def test_topology_on_channel_and_node_pages(
    tmp_path_factory: pytest.TempPathFactory, new_page: NewPage
) -> None:
    """An nsqd in zone z1 / region r1 with the experiment on, one zone-local consumer."""
    base = tmp_path_factory.mktemp("topology-ui")
    nsqds, admins = ServerPool(NSQD_WITH_HTTP, base), ServerPool(NSQADMIN, base)
    try:
        nsqd = nsqds.start(
            enable_experiment="topology-aware-consumption",
            topology_zone="z1",
            topology_region="r1",
            broadcast_address="127.0.0.1",
        )
        node = nsqd.http_address
        assert node
        admin = admins.start(nsqd_http_address=node)
        with consumer(
            nsqd.tcp_address, "geo", "near", rdy=5, topology_zone="z1", topology_region="r1"
        ):
            with RawClient(nsqd.tcp_address) as producer:
                producer.mpub("geo", [b"a", b"b", b"c"])
            page = new_page()
            page.goto(url(admin, "topics/geo/near"))
            expect(page.locator('[data-tile="locality"] .tile-value')).to_have_text("3 / 0 / 0")
            client = page.locator("#channel-clients tbody tr")
            expect(client.locator(".badges").first).to_have_text("region r1zone z1")
            expect(client.locator(".badges").nth(1)).to_have_text("region r1zone z1")  # its nsqd
            screenshot(page, "channel-topology")
            page.goto(url(admin, f"nodes/{node}"))
            expect(page.locator(".page-title .badges")).to_have_text("region r1zone z1")
    finally:
        admins.stop_all()
        nsqds.stop_all()
