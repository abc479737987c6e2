"""The connector beside Spark's Kafka connector (issue 31), without Spark: several topics and
topicPattern in the planner, minMessagesPerTrigger with maxTriggerDelay, the lag report,
failOnDataLoss of the log and of the sink's markers, and the sink's routing (topic column,
option wins, deferMs by DPUB) as encoded commands."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from nsqpy.spark._conn import Columns
from nsqpy.spark._http import Backlog, HTTPError, Producer
from nsqpy.spark._offsets import Offset
from nsqpy.spark._options import SinkOptions, SourceOptions
from nsqpy.spark._schema import to_record_batch
from nsqpy.spark._sink import _check_markers, check_sink_schema, encode_commands
from nsqpy.spark._source import _Planner
from nsqpy.spark._wal import WAL, DataLossError, Seal
from nsqpy.wire.v2 import CommandParser, mpub_bodies

# -- options ---------------------------------------------------------------------------------


def _source(**raw: str) -> SourceOptions:
    """Source options on nsqd ``a:1`` (``lookupdHTTPAddresses`` given: on it instead)."""
    base = {"channel": "c", "walLocation": "/tmp/x"}
    if "lookupdHTTPAddresses" not in raw:
        base["nsqdTCPAddresses"] = "a:1"
    return SourceOptions.parse({k.lower(): v for k, v in {**base, **raw}.items()}, streaming=True)


def test_topic_options() -> None:
    assert _source(topic="t").topics == ("t",)
    assert _source(topics=" t1, t2 ").topics == ("t1", "t2")
    pattern = _source(topicPattern="ev-.*", nsqdHTTPAddresses="a:2").topic_pattern
    assert pattern is not None and pattern.fullmatch("ev-1") and not pattern.fullmatch("xev-1")
    for bad, message in [
        ({"topic": "t", "topics": "u"}, "exactly one of the options topic, topics"),
        ({}, "exactly one of the options topic, topics"),
        ({"topics": "t,t"}, "listed twice"),
        ({"topics": "t,b@d"}, "not a valid NSQ topic name"),
        ({"topicPattern": "("}, "not a regular expression"),
        ({"topicPattern": "t.*"}, "topicPattern needs lookupdHTTPAddresses or nsqdHTTPAddresses"),
        (
            {"topic": "t", "minMessagesPerTrigger": "10", "maxMessagesPerTrigger": "5"},
            "must not exceed",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            _source(**bad)


# -- the planner -----------------------------------------------------------------------------


def _planner(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    depths: dict[tuple[str, str], Backlog | None],
    **raw: str,
) -> _Planner:
    options = _source(walLocation=str(tmp_path), numPartitions="1", **raw)
    planner = _Planner(options)

    def fake_depths(fresh: bool = False) -> dict[tuple[str, str], Backlog | None]:
        planner._depths = (0.0, dict(depths))
        return dict(depths)

    monkeypatch.setattr(planner, "depths", fake_depths)
    return planner


def test_several_topics_are_planned_per_topic_and_nsqd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    depths: dict[tuple[str, str], Backlog | None] = {
        ("t1", "a:1"): Backlog(3000),
        ("t2", "a:1"): Backlog(1000),
        ("t3", "a:1"): Backlog(0),
    }
    planner = _planner(tmp_path, monkeypatch, depths, topics="t1,t2,t3")
    end = Offset.from_json(planner.latest_offset(planner.initial_offset(), ReadMaxRows(2000)))
    assert {s: sum(q) for s, q in end.quotas.items()} == {("t1", "a:1"): 1500, ("t2", "a:1"): 500}
    assert os.path.exists(tmp_path / end.run / "RUN")  # the run's log exists before its batch


def test_depths_ask_each_nsqd_once_for_all_topics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = _Planner(_source(topics="t1,t2", nsqdHTTPAddresses="h:1", walLocation=str(tmp_path)))
    calls: list[tuple[str, list[str]]] = []

    def backlogs(http: str, topics: list[str], channel: str, timeout: float) -> dict[str, Any]:
        calls.append((http, topics))
        return {t: Backlog(5) for t in topics}

    monkeypatch.setattr("nsqpy.spark._source.channel_backlogs", backlogs)
    assert planner.depths() == {("t1", "a:1"): Backlog(5), ("t2", "a:1"): Backlog(5)}
    assert calls == [("h:1", ["t1", "t2"])]


def test_topic_pattern_discovery_is_polled_at_the_lookupd_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = _Planner(
        _source(lookupdHTTPAddresses="l:1", topicPattern="ev-[0-9]+", lookupdPollInterval="1h")
    )
    known = ["ev-1", "other", "ev-x"]
    polls: list[int] = []

    def topics(lookupds: tuple[str, ...], timeout: float) -> list[str]:
        polls.append(1)
        return list(known)

    def producers(lookupds: tuple[str, ...], topic: str, timeout: float) -> list[Producer]:
        return [Producer("n:1", "n:2")]

    monkeypatch.setattr("nsqpy.spark._source.lookup_topics", topics)
    monkeypatch.setattr("nsqpy.spark._source.lookup_producers", producers)
    assert [t for t, _ in planner.sources()] == ["ev-1"]
    known.append("ev-22")
    assert [t for t, _ in planner.sources()] == ["ev-1"]  # within lookupdPollInterval
    assert polls == [1]
    assert planner._sources is not None
    planner._sources = (planner._sources[0] - 7200, planner._sources[1])
    assert [t for t, _ in planner.sources()] == ["ev-1", "ev-22"]


def test_topic_pattern_over_each_nsqd_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without nsqlookupd, each listed nsqd's /stats says which topics it has: a topic is read
    only where it exists (never created on the others); an nsqd that does not answer keeps its
    last topics."""
    planner = _Planner(
        _source(
            nsqdTCPAddresses="a:1,b:1",
            nsqdHTTPAddresses="a:2,b:2",
            topicPattern="ev-.*",
            lookupdPollInterval="0ms",
            walLocation=str(tmp_path),
        )
    )
    topics = {"a:2": ["ev-1", "other"], "b:2": ["ev-2"]}

    def nsqd_topics(http: str, timeout: float) -> list[str]:
        if http not in topics:
            raise HTTPError(f"{http} is down")
        return topics[http]

    monkeypatch.setattr("nsqpy.spark._source.nsqd_topics", nsqd_topics)
    found = [(t, p.tcp_address) for t, p in planner.sources()]
    assert found == [("ev-1", "a:1"), ("ev-2", "b:1")]
    del topics["b:2"]
    topics["a:2"].append("ev-3")
    found = [(t, p.tcp_address) for t, p in planner.sources()]
    assert found == [("ev-1", "a:1"), ("ev-3", "a:1"), ("ev-2", "b:1")]


def test_min_messages_wait_for_max_trigger_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    depths: dict[tuple[str, str], Backlog | None] = {("t", "a:1"): Backlog(40)}
    planner = _planner(
        tmp_path, monkeypatch, depths, topic="t", minMessagesPerTrigger="100", maxTriggerDelay="1h"
    )
    start = planner.initial_offset()
    assert planner.latest_offset(start, ReadAllAvailable()) is start  # too few, not too late
    depths[("t", "a:1")] = Backlog(100)
    assert Offset.from_json(planner.latest_offset(start, ReadAllAvailable())).total == 100
    depths[("t", "a:1")] = Backlog(40)
    planner._last_trigger -= 3600  # the oldest has waited maxTriggerDelay
    assert Offset.from_json(planner.latest_offset(start, ReadAllAvailable())).total == 40
    # Trigger.AvailableNow takes what is there, whatever the minimum.
    planner._last_trigger += 3600
    planner.prepare_available_now()
    assert Offset.from_json(planner.latest_offset(start, ReadAllAvailable())).total == 40


def test_lag_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    depths: dict[tuple[str, str], Backlog | None] = {
        ("t1", "a:1"): Backlog(ready=5, incoming=2, in_flight=3, deferred=1),
        ("t2", "b:1"): None,
    }
    planner = _planner(tmp_path, monkeypatch, depths, topics="t1,t2")
    lag = planner.lag()
    assert lag == {
        "channel": "c",
        "messagesBehind": 11,
        "nsqdWithoutDepth": 1,
        "topics": {
            "t1": {
                "a:1": {
                    "channelDepth": 5,
                    "topicDepth": 2,
                    "inFlight": 3,
                    "deferred": 1,
                    "messagesBehind": 11,
                }
            },
            "t2": {"b:1": {"unknown": True}},
        },
    }
    json.dumps(lag)  # what Spark puts in StreamingQueryProgress.sources[].latestOffset


# -- failOnDataLoss: the log -----------------------------------------------------------------


def _batch(n: int) -> Any:
    cols = Columns()
    for i in range(n):
        cols.append(f"{i:016x}".encode(), 1_700_000_000_000_000_000, 1, b"b%d" % i)
    return to_record_batch(cols, "t", "c", "n:1")


def test_a_lost_run_fails_or_goes_on(tmp_path: Path) -> None:
    strict = WAL(str(tmp_path))
    strict.start_run("r")
    strict.check_run("r")  # there
    with pytest.raises(DataLossError, match=r"the log of run gone is gone.*failOnDataLoss=false"):
        strict.check_run("gone")
    lenient = WAL(str(tmp_path), fail_on_data_loss=False)
    lenient.check_run("gone2")  # logged, and the run starts again
    strict.check_run("gone2")


def test_damaged_log_fails_or_replays_what_is_left(tmp_path: Path) -> None:
    strict = WAL(str(tmp_path))
    lenient = WAL(str(tmp_path), fail_on_data_loss=False)
    pdir = strict.partition_dir("r", 1, 0)
    segments = [strict.write_segment(pdir, _batch(3)), strict.write_segment(pdir, _batch(2))]
    assert strict.seal(pdir, segments, 5, "n:1", "t")
    os.unlink(os.path.join(pdir, segments[1]))
    seal = strict.read_seal(pdir)
    assert seal is not None and seal.topic == "t"
    with pytest.raises(DataLossError, match="cannot be read"):
        list(strict.replay(pdir, seal, "t", "c"))
    assert sum(b.num_rows for b in lenient.replay(pdir, seal, "t", "c")) == 3

    with open(os.path.join(pdir, "SEALED"), "w") as f:
        f.write("{not json")
    with pytest.raises(DataLossError, match="damaged seal"):
        strict.read_seal(pdir)
    assert lenient.read_seal(pdir) == Seal((), 0, "")  # replays as empty, never read again

    other = strict.partition_dir("r", 1, 1)
    strict.seal(other, [], 0, "n:1", "t")
    strict.mark_finned(other, [])
    os.unlink(os.path.join(other, "SEALED"))
    with pytest.raises(DataLossError, match="seal is gone"):
        strict.read_seal(other)


# -- failOnDataLoss: the sink's markers ------------------------------------------------------


def _sink(tmp_path: Path, **raw: str) -> SinkOptions:
    base = {"nsqdTCPAddresses": "a:1", "topic": "t", "markerLocation": str(tmp_path)}
    return SinkOptions.parse({k.lower(): v for k, v in {**base, **raw}.items()})


def test_markers_lost_or_damaged(tmp_path: Path) -> None:
    options = _sink(tmp_path)
    _check_markers(options, 0, str(tmp_path / "0" / "0"))  # a new query: nothing expected
    with pytest.raises(DataLossError, match="no marker of the batches before 3"):
        _check_markers(options, 3, str(tmp_path / "3" / "0"))
    _check_markers(_sink(tmp_path, failOnDataLoss="false"), 3, str(tmp_path / "3" / "0"))
    (tmp_path / "COMMITTED").write_text("2\n")
    _check_markers(options, 3, str(tmp_path / "3" / "0"))  # the next batch
    (tmp_path / "COMMITTED").write_text("3\n")
    _check_markers(options, 3, str(tmp_path / "3" / "0"))  # re-executed after its commit
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "0").write_text("garbage")
    with pytest.raises(DataLossError, match="damaged"):
        _check_markers(options, 3, str(tmp_path / "3" / "0"))
    with pytest.raises(DataLossError, match="names batch 3, not 6"):
        _check_markers(options, 7, str(tmp_path / "7" / "0"))


# -- the sink's routing ----------------------------------------------------------------------


def _commands(encoded: list[bytes]) -> list[tuple[str, int | None, list[bytes]]]:
    """(verb topic, DPUB delay, bodies) of each encoded command, parsed by the wire codec."""
    parser = CommandParser(1 << 20, 5 << 20, 3_600_000)
    parser.feed(b"".join(encoded))
    out: list[tuple[str, int | None, list[bytes]]] = []
    while (command := parser.next_command()) is not None:
        params, body = command
        verb = params[0].decode() + " " + params[1].decode()
        if params[0] == b"MPUB":
            bodies = body if isinstance(body, list) else mpub_bodies(body)  # type: ignore[arg-type]
            out.append((verb, None, bodies))
        else:
            assert isinstance(body, bytes)
            out.append((verb, int(params[2]), [body]))
    return out


def test_topic_column_routes_and_option_wins() -> None:
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("body", BinaryType()),
            StructField("deferMs", IntegerType()),
        ]
    )
    routed = _sink(Path("/tmp"), topic="")
    routing = check_sink_schema(schema, routed)
    assert routing.by_column and routing.deferred and not routing.plain
    batch = pa.record_batch(
        [
            pa.array(["a", "b", "a", "b", "a"]),
            pa.array([b"1", b"2", b"3", b"4", b"5"]),
            pa.array([None, None, 2000, None, None], pa.int32()),
        ],
        names=["topic", "body", "deferMs"],
    )
    counter = [0]
    commands = _commands(list(encode_commands(iter([batch]), routed, routing, counter)))
    assert counter == [5]
    assert sorted(commands) == [
        ("DPUB a", 2000, [b"3"]),
        ("MPUB a", None, [b"1", b"5"]),
        ("MPUB b", None, [b"2", b"4"]),
    ]
    fixed = _sink(Path("/tmp"), topic="t")  # the option wins over the column, as in Kafka
    routing = check_sink_schema(schema, fixed)
    commands = _commands(list(encode_commands(iter([batch]), fixed, routing, [0])))
    assert sorted(commands) == [
        ("DPUB t", 2000, [b"3"]),
        ("MPUB t", None, [b"1", b"2", b"4", b"5"]),
    ]


def test_routing_errors() -> None:
    body_only = StructType([StructField("body", BinaryType())])
    with pytest.raises(ValueError, match="needs the option topic or a 'topic' column"):
        check_sink_schema(body_only, _sink(Path("/tmp"), topic=""))
    bad_defer = StructType(
        [StructField("body", BinaryType()), StructField("deferMs", StringType())]
    )
    with pytest.raises(ValueError, match="'deferMs' must be an integer"):
        check_sink_schema(bad_defer, _sink(Path("/tmp")))
    routed = _sink(Path("/tmp"), topic="")
    schema = StructType([StructField("topic", StringType()), StructField("body", BinaryType())])
    routing = check_sink_schema(schema, routed)
    for topics, message in [([None], "null 'topic'"), (["b@d"], "not a valid NSQ topic name")]:
        batch = pa.record_batch(
            [pa.array(topics, pa.string()), pa.array([b"x"])], names=["topic", "body"]
        )
        with pytest.raises(ValueError, match=re.escape(message)):
            list(encode_commands(iter([batch]), routed, routing, [0]))
