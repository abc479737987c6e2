"""The driver-side planner: depth → offsets, admission control, Trigger.AvailableNow."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from nsqpy.spark._http import Backlog
from nsqpy.spark._offsets import Offset
from nsqpy.spark._options import SourceOptions
from nsqpy.spark._source import _Planner
from nsqpy.spark._wal import WAL


def _planner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depths: dict[str, Backlog | None]
) -> _Planner:
    options = SourceOptions.parse(
        {
            "nsqdtcpaddresses": "a:1,b:2",
            "topic": "t",
            "channel": "c",
            "wallocation": str(tmp_path),
            "numpartitions": "2",
        },
        streaming=True,
    )
    planner = _Planner(options)

    def fake_depths(fresh: bool = False) -> dict[tuple[str, str], Backlog | None]:
        per_source = {("t", a): d for a, d in depths.items()}
        planner._depths = (0.0, per_source)
        return dict(per_source)

    monkeypatch.setattr(planner, "depths", fake_depths)
    return planner


def _read(tmp_path: Path, offset: dict[str, object], rows: dict[str, int]) -> None:
    """Pretend the batch of ``offset`` ran and read ``rows`` per nsqd."""
    o = Offset.from_json(offset)
    wal = WAL(str(tmp_path))
    for i, (topic, address) in enumerate(sorted(o.quotas)):
        pdir = wal.partition_dir(o.run, o.batch, i)
        assert wal.seal(pdir, [], rows.get(address, 0), address, topic)


def test_no_data_no_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planner = _planner(tmp_path, monkeypatch, {"a:1": Backlog(0), "b:2": Backlog(0)})
    start = planner.initial_offset()
    assert planner.latest_offset(start, ReadAllAvailable()) is start


def test_read_limit_split_by_depth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planner = _planner(tmp_path, monkeypatch, {"a:1": Backlog(3000), "b:2": Backlog(1000)})
    end = Offset.from_json(planner.latest_offset(planner.initial_offset(), ReadMaxRows(1000)))
    assert end.batch == 1
    assert {a: sum(q) for (_, a), q in end.quotas.items()} == {"a:1": 750, "b:2": 250}
    everything = planner.latest_offset(planner.initial_offset(), ReadAllAvailable())
    assert Offset.from_json(everything).total == 4000


def test_available_now_stops_at_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    depths: dict[str, Backlog | None] = {"a:1": Backlog(1500)}
    planner = _planner(tmp_path, monkeypatch, depths)
    start = planner.initial_offset()
    planner.prepare_available_now()
    depths["a:1"] = Backlog(5000)  # published after the query started: not for this run
    depths["c:3"] = Backlog(800)  # an nsqd that appeared since: not for this run either
    first = planner.latest_offset(start, ReadMaxRows(1000))
    assert Offset.from_json(first).quotas == {("t", "a:1"): (500, 500)}
    _read(tmp_path, first, {"a:1": 1000})
    second = planner.latest_offset(first, ReadMaxRows(1000))
    assert Offset.from_json(second).total == 500
    _read(tmp_path, second, {"a:1": 500})
    assert planner.latest_offset(second, ReadMaxRows(1000)) is second


def test_without_depth_an_empty_batch_pauses_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = _planner(tmp_path, monkeypatch, {"a:1": None})
    first = planner.latest_offset(planner.initial_offset(), ReadMaxRows(4000))
    assert Offset.from_json(first).total == 4000
    _read(tmp_path, first, {"a:1": 0})
    assert planner.latest_offset(first, ReadMaxRows(4000)) is first  # within emptyPollInterval


def test_incoming_topic_backlog_is_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A channel just created holds little yet; the topic's backlog is on its way into it."""
    depths: dict[str, Backlog | None] = {"a:1": Backlog(ready=10_000, incoming=290_000)}
    planner = _planner(tmp_path, monkeypatch, depths)
    start = planner.initial_offset()
    first = planner.latest_offset(start, ReadMaxRows(100_000))
    assert Offset.from_json(first).total == 100_000
    planner.prepare_available_now()
    everything = planner.latest_offset(start, ReadAllAvailable())
    assert Offset.from_json(everything).total == 300_000


def test_available_now_waits_for_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages in flight elsewhere (a dead consumer's) come back after msg_timeout: the
    AvailableNow query waits for them instead of ending, and ends once none is in transit."""
    depths: dict[str, Backlog | None] = {"a:1": Backlog(ready=1000, in_flight=500)}
    planner = _planner(tmp_path, monkeypatch, depths)
    start = planner.initial_offset()
    planner.prepare_available_now()
    first = planner.latest_offset(start, ReadAllAvailable())
    assert Offset.from_json(first).total == 1000
    _read(tmp_path, first, {"a:1": 1000})
    depths["a:1"] = Backlog(ready=0, in_flight=500)
    polls = []

    def back_later(_: float) -> None:
        polls.append(1)
        if len(polls) == 3:  # timed out in nsqd: back in the channel
            depths["a:1"] = Backlog(ready=500)

    monkeypatch.setattr("nsqpy.spark._source.time.sleep", back_later)
    second = planner.latest_offset(first, ReadAllAvailable())
    assert Offset.from_json(second).total == 500 and len(polls) == 3
    _read(tmp_path, second, {"a:1": 500})
    depths["a:1"] = Backlog(ready=0, in_flight=200)  # budget spent: not waited for
    assert planner.latest_offset(second, ReadAllAvailable()) is second
    assert len(polls) == 3


def test_available_now_in_transit_wait_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = _planner(tmp_path, monkeypatch, {"a:1": Backlog(ready=0, deferred=10)})
    planner._in_transit_wait = 0.0
    monkeypatch.setattr("nsqpy.spark._source.time.sleep", lambda _: None)
    start = planner.initial_offset()
    planner.prepare_available_now()
    assert planner.latest_offset(start, ReadAllAvailable()) is start


def test_paused_counts_nothing() -> None:
    from nsqpy.spark._http import _backlog

    topic = {"depth": 7, "paused": False}
    assert _backlog(topic, {"depth": 5, "in_flight_count": 2}) == Backlog(5, 7, 2, 0)
    assert _backlog({**topic, "paused": True}, {"depth": 5}) == Backlog(5, 0, 0, 0)
    assert _backlog(topic, {"depth": 5, "paused": True}) == Backlog(0)
