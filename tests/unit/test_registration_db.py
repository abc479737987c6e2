"""nsqlookupd's registration DB (nsqpy.nsqlookupd.registration_db), after Go's tests."""

from __future__ import annotations

from nsqpy.nsqlookupd.registration_db import (
    ZERO_TIME_UNIX_NANO,
    PeerInfo,
    Producer,
    Registration,
    RegistrationDB,
    filter_by_active,
    filter_registrations,
    keys,
    subkeys,
)

SECOND = 1_000_000_000


def peer(peer_id: str, last_update: int = 0) -> PeerInfo:
    return PeerInfo(
        id=peer_id,
        remote_address=peer_id,
        hostname="host",
        broadcast_address="b",
        tcp_port=4150,
        http_port=4151,
        version="1.3.0",
        last_update=last_update,
    )


def test_add_and_remove_producers() -> None:
    db = RegistrationDB()
    key = Registration("topic", "a", "")
    p1 = Producer(peer("1"))
    assert db.add_producer(key, p1) is True
    assert db.add_producer(key, Producer(peer("1"))) is False  # same id
    assert db.add_producer(key, Producer(peer("2"))) is True
    assert [p.peer_info.id for p in db.find_producers("topic", "a", "")] == ["1", "2"]
    assert db.remove_producer(key, "1") == (True, 1)
    assert db.remove_producer(key, "1") == (False, 1)
    assert db.remove_producer(key, "2") == (True, 0)
    # the key stays, empty
    assert key in db
    assert db.find_registrations("topic", "a", "") == [key]
    assert db.find_producers("topic", "a", "") == []
    assert db.remove_producer(Registration("topic", "nope", ""), "1") == (False, 0)


def test_add_registration_is_idempotent() -> None:
    db = RegistrationDB()
    key = Registration("channel", "a", "b")
    db.add_producer(key, Producer(peer("1")))
    db.add_registration(key)
    assert len(db.find_producers("channel", "a", "b")) == 1
    db.add_registration(Registration("topic", "x", ""))
    assert keys(db.find_registrations("topic", "*", "")) == ["x"]


def test_find_with_wildcards() -> None:
    db = RegistrationDB()
    p1, p2, p3 = peer("1"), peer("2"), peer("3")
    db.add_producer(Registration("client", "", ""), Producer(p1))
    db.add_producer(Registration("topic", "a", ""), Producer(p1))
    db.add_producer(Registration("topic", "b", ""), Producer(p2))
    db.add_producer(Registration("channel", "a", "c1"), Producer(p1))
    db.add_producer(Registration("channel", "a", "c2"), Producer(p3))
    db.add_producer(Registration("channel", "b", "c1"), Producer(p2))

    assert keys(db.find_registrations("topic", "*", "")) == ["a", "b"]
    assert db.find_registrations("topic", "*", "x") == []
    assert subkeys(db.find_registrations("channel", "a", "*")) == ["c1", "c2"]
    assert sorted(map(str, db.find_registrations("channel", "*", "c1"))) == sorted(
        map(str, [Registration("channel", "a", "c1"), Registration("channel", "b", "c1")])
    )
    assert len(db.find_registrations("channel", "*", "*")) == 3
    assert db.find_registrations("channel", "z", "*") == []
    assert db.find_registrations("nope", "*", "*") == []

    # producers are deduplicated by id over the matching keys
    ids = [p.peer_info.id for p in db.find_producers("channel", "*", "*")]
    assert sorted(ids) == ["1", "2", "3"]
    assert [p.peer_info.id for p in db.find_producers("channel", "a", "*")] == ["1", "3"]
    assert db.find_producers("channel", "a", "c9") == []

    assert db.lookup_registrations("1") == [
        Registration("client", "", ""),
        Registration("topic", "a", ""),
        Registration("channel", "a", "c1"),
    ]
    assert filter_registrations(db.lookup_registrations("1"), "topic", "*", "") == [
        Registration("topic", "a", "")
    ]
    assert db.lookup_registrations("9") == []


def test_remove_registration() -> None:
    db = RegistrationDB()
    key = Registration("channel", "a", "c")
    db.add_producer(key, Producer(peer("1")))
    db.add_producer(Registration("topic", "a", ""), Producer(peer("1")))
    db.remove_registration(key)
    db.remove_registration(key)  # absent: no error
    assert key not in db
    assert db.find_registrations("channel", "*", "*") == []
    assert db.lookup_registrations("1") == [Registration("topic", "a", "")]
    # the key can come back
    db.add_registration(key)
    assert subkeys(db.find_registrations("channel", "a", "*")) == ["c"]


def test_disconnect_removes_producer_everywhere_keeps_keys() -> None:
    db = RegistrationDB()
    info = peer("1")
    for key in (
        Registration("client", "", ""),
        Registration("topic", "a", ""),
        Registration("channel", "a", "c"),
    ):
        db.add_producer(key, Producer(info))
    for key in db.lookup_registrations("1"):
        assert db.remove_producer(key, "1") == (True, 0)
    assert db.lookup_registrations("1") == []
    assert len(db) == 3
    assert keys(db.find_registrations("topic", "*", "")) == ["a"]


def test_registration_is_match() -> None:
    k = Registration("channel", "a", "b")
    assert k.is_match("channel", "a", "b")
    assert k.is_match("channel", "*", "b")
    assert k.is_match("channel", "a", "*")
    assert k.is_match("channel", "*", "*")
    assert not k.is_match("topic", "*", "*")
    assert not k.is_match("channel", "x", "*")
    assert not k.is_match("channel", "*", "x")


def test_tombstones() -> None:
    p = Producer(peer("1"))
    assert p.tombstoned_at == ZERO_TIME_UNIX_NANO
    assert not p.is_tombstoned(45 * SECOND)
    p.tombstone(now=100 * SECOND)
    assert p.tombstoned
    assert p.is_tombstoned(45 * SECOND, now=144 * SECOND)
    assert not p.is_tombstoned(45 * SECOND, now=145 * SECOND)
    assert p.tombstoned  # the flag stays; only the lifetime ends
    assert str(p) == "b [4150, 4151]"


def test_filter_by_active() -> None:
    now = 1000 * SECOND
    fresh = Producer(peer("fresh", last_update=now - 10 * SECOND))
    stale = Producer(peer("stale", last_update=now - 301 * SECOND))
    edge = Producer(peer("edge", last_update=now - 300 * SECOND))
    tomb = Producer(peer("tomb", last_update=now))
    tomb.tombstone(now=now - 5 * SECOND)
    old_tomb = Producer(peer("old_tomb", last_update=now))
    old_tomb.tombstone(now=now - 50 * SECOND)
    producers = [fresh, stale, edge, tomb, old_tomb]

    active = filter_by_active(producers, 300 * SECOND, 45 * SECOND, now)
    assert [p.peer_info.id for p in active] == ["fresh", "edge", "old_tomb"]
    # /nodes passes a zero lifetime: tombstoned producers are kept
    active = filter_by_active(producers, 300 * SECOND, 0, now)
    assert [p.peer_info.id for p in active] == ["fresh", "edge", "tomb", "old_tomb"]


def test_peer_info_json() -> None:
    info = peer("1.2.3.4:5")
    assert list(info.to_json()) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "topology_zone",
        "topology_region",
    ]
