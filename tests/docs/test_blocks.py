"""The doc-block reader and comparisons (tests/docs/_blocks.py), without processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs._blocks import DocError, Substitutions, blocks, console_steps, output_matches


def test_blocks_read_language_marker_and_indentation(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "intro\n\n<!-- doc-test: background; expect: ready -->\n```sh\n./scripts/run.sh\n```\n"
        "1. step\n\n   ```python\n   print(1)\n   ```\n"
    )
    first, second = blocks(doc)
    assert (first.lang, first.line, first.directives) == (
        "sh",
        4,
        {"background": "", "expect": "ready"},
    )
    assert (second.lang, second.text, second.directives) == ("python", "print(1)\n", {})


def test_refusals(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    for text, message in [
        ("```\nx\n```\n", "language"),
        ("```sh\nx\n", "unclosed"),
        ("<!-- doc-test: skip:   -->\n```sh\nx\n```\n", "must say why"),
        ("<!-- doc-test: later -->\n```sh\nx\n```\n", "unknown"),
        ("<!-- doc-test: expect: x -->\n```sh\nx\n```\n", "background"),
    ]:
        doc.write_text(text)
        with pytest.raises(DocError, match=message):
            blocks(doc)


def test_console_steps() -> None:
    steps = console_steps("$ curl a \\\n  -d b\nOK\n$ true\n$ echo x\nx\n")
    assert [(s.command, s.expected) for s in steps] == [
        ("curl a \\\n  -d b", "OK"),
        ("true", ""),
        ("echo x", "x"),
    ]
    with pytest.raises(DocError):
        console_steps("output first\n$ true\n")


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [
        ("OK", "OK\n", True),
        ("OK", "NO", False),
        ("", "", True),
        ("", "something", False),
        ('{"a": 1,\n "b": [...]}', '{"b":[1,2],"a":1}', True),
        ('{"a": 1}', '{"a":1,"b":2}', False),
        ('{"id":"...","ts":...,"body":"eA=="}', '{"id":"x1","ts":12,"body":"eA=="}', True),
        ('{"id":"...","ts":...,"body":"eA=="}', '{"id":"x1","ts":12,"body":"eQ=="}', False),
        ("nsqd v1.3.0 (built w/...)", "nsqd v1.3.0 (built w/nsqpy-0.1.0)\n", True),
    ],
)
def test_output_matches(expected: str, actual: str, same: bool) -> None:
    assert output_matches(expected, actual) is same


def test_substitutions() -> None:
    subs = Substitutions(
        ports={4150: 50001, 4151: 50002},
        replace={"spark://host:7077": "spark://127.0.0.1:7", "/shared/": "/tmp/x/shared/"},
        run_sh_args=["--data-path=/tmp/4150/d{n}"],
        tiny_args={"run_bench.py": ["--runfor", "0.2s"]},
    )
    text = (
        "./scripts/run.sh &   # nsqd on 4150\n"
        "curl 'http://127.0.0.1:4151/pub?topic=t' -d 41500\n"
        ".venv/bin/python bench/run_bench.py --runfor 10s  # '#' quoted\n"
        "spark-submit --master spark://host:7077 \\\n  app.py\n"
        "ls /shared/ckpt ../shared/ref /work/shared/x\n"
    )
    assert subs.apply(text).split("\n") == [
        "./scripts/run.sh --data-path=/tmp/4150/d1 &   # nsqd on 50001",
        "curl 'http://127.0.0.1:50002/pub?topic=t' -d 41500",
        ".venv/bin/python bench/run_bench.py --runfor 10s --runfor 0.2s  # '#' quoted",
        "spark-submit --master spark://127.0.0.1:7 app.py",
        "ls /tmp/x/shared/ckpt ../shared/ref /work/shared/x",
        "",
    ]
