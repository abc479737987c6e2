"""events_app against real nsqd and nsqlookupd from nsqpy's pytest fixtures."""

import events_app
import pytest


def test_published_events_wait_in_nsqd(nsqd, run):
    run(events_app.publish(nsqd.tcp_address, "signups", [b"ann", b"bob"]))
    assert nsqd.depth("signups") == 2
    # ini option nsqpy_nsqd_flags reached the server
    assert nsqd.flags["msg_timeout"] == "10s"


def test_consumer_gets_what_nsqd_holds(nsqd, run):
    nsqd.mpub("orders", [b"1", b"2\nwith a newline", b"3"])
    got = run(events_app.consume("orders", "billing", 3, nsqd_tcp_addresses=[nsqd.tcp_address]))
    assert sorted(got) == [b"1", b"2\nwith a newline", b"3"]
    channel = nsqd.stats("orders")["topics"][0]["channels"][0]
    assert channel["channel_name"] == "billing" and channel["message_count"] == 3


@pytest.mark.parametrize("nsqd", [{"mem_queue_size": 0}], indirect=True)
def test_disk_only_nsqd(nsqd, run):
    assert nsqd.flags["mem_queue_size"] == 0
    run(events_app.publish(nsqd.tcp_address, "audit", [b"a", b"b", b"c"]))
    topic = nsqd.stats("audit")["topics"][0]
    assert topic["backend_depth"] == 3


def test_reader_finds_every_nsqd_through_lookupd(nsq_cluster, run):
    assert len(nsq_cluster.nsqds) == 2
    for i, nsqd in enumerate(nsq_cluster.nsqds):
        nsqd.pub("clicks", f"from nsqd {i}")
    got = run(
        events_app.consume(
            "clicks", "stats", 2, lookupd_http_addresses=nsq_cluster.lookupd_http_addresses
        )
    )
    assert sorted(got) == [b"from nsqd 0", b"from nsqd 1"]


def test_tls_required(nsqd_factory, run):
    secure = nsqd_factory(tls=True, tls_required="true")
    tls = {"tls_v1": True, "tls_options": {"ca_certs": str(secure.tls.ca)}}
    run(events_app.publish(secure.tcp_address, "secrets", [b"s3cr3t"], **tls))
    got = run(
        events_app.consume("secrets", "vault", 1, nsqd_tcp_addresses=[secure.tcp_address], **tls)
    )
    assert got == [b"s3cr3t"]


def test_events_survive_an_nsqd_crash(nsqd_factory, run):
    nsqd = nsqd_factory(mem_queue_size=0, sync_every=1)  # acknowledged = on disk
    run(events_app.publish(nsqd.tcp_address, "payments", [b"p1", b"p2"]))
    nsqd.kill()  # SIGKILL: no graceful exit
    nsqd.restart()
    got = run(events_app.consume("payments", "ledger", 2, nsqd_tcp_addresses=[nsqd.tcp_address]))
    assert sorted(got) == [b"p1", b"p2"]
