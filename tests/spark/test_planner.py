"""The driver-side planner: depth → offsets, admission control, Trigger.AvailableNow."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from nsqpy.spark._offsets import Offset
from nsqpy.spark._options import SourceOptions
from nsqpy.spark._source import _Planner
from nsqpy.spark._wal import WAL


def _planner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depths: dict[str, int | None]
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
    monkeypatch.setattr(planner, "depths", lambda fresh=False: dict(depths))
    return planner


def _read(tmp_path: Path, offset: dict[str, object], rows: dict[str, int]) -> None:
    """Pretend the batch of ``offset`` ran and read ``rows`` per nsqd."""
    o = Offset.from_json(offset)
    wal = WAL(str(tmp_path))
    for i, address in enumerate(sorted(o.quotas)):
        assert wal.seal(wal.partition_dir(o.run, o.batch, i), [], rows.get(address, 0), address)


def test_no_data_no_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planner = _planner(tmp_path, monkeypatch, {"a:1": 0, "b:2": 0})
    start = planner.initial_offset()
    assert planner.latest_offset(start, ReadAllAvailable()) is start


def test_read_limit_split_by_depth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planner = _planner(tmp_path, monkeypatch, {"a:1": 3000, "b:2": 1000})
    end = Offset.from_json(planner.latest_offset(planner.initial_offset(), ReadMaxRows(1000)))
    assert end.batch == 1
    assert {a: sum(q) for a, q in end.quotas.items()} == {"a:1": 750, "b:2": 250}
    everything = planner.latest_offset(planner.initial_offset(), ReadAllAvailable())
    assert Offset.from_json(everything).total == 4000


def test_available_now_stops_at_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    depths: dict[str, int | None] = {"a:1": 1500}
    planner = _planner(tmp_path, monkeypatch, depths)
    start = planner.initial_offset()
    planner.prepare_available_now()
    depths["a:1"] = 5000  # published after the query started: not for this run
    depths["c:3"] = 800  # an nsqd that appeared since: not for this run either
    first = planner.latest_offset(start, ReadMaxRows(1000))
    assert Offset.from_json(first).quotas == {"a:1": (500, 500)}
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
