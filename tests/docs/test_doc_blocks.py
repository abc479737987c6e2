"""Every code block of README.md, docs/*.md and bench/README.md runs, as written.

One test per file: its blocks run in order against a local NSQ on free ports (the doc's
own ``./scripts/run.sh`` block starts it, else the test does), with the docs' default
ports and placeholders substituted (``_blocks.Substitutions``). A console block's output
must be the one shown; a block that fails fails the doc. Spark blocks run on one
standalone cluster shared by the whole run. See docs/TESTING.md ("The docs' own test").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs._blocks import CHECKED, DocError, blocks
from tests.docs._runner import REPO, DocRun

DOCS = sorted(
    [REPO / "README.md", REPO / "bench" / "README.md", *(REPO / "docs").glob("*.md")],
    key=lambda p: str(p.relative_to(REPO)),
)
SPARK_PLACEHOLDER = "spark://host:7077"

pytestmark = pytest.mark.timeout(600)


def uses_spark_cluster(path: Path) -> bool:
    return any(SPARK_PLACEHOLDER in b.text for b in blocks(path) if b.runs)


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One standalone Spark cluster for every doc that names ``spark://host:7077``."""
    from tests.spark._standalone import StandaloneCluster

    cluster = StandaloneCluster(tmp_path_factory.mktemp("doc-spark"))
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.stop()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_doc_blocks_run(path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    doc = blocks(path)
    master = request.getfixturevalue("spark_master") if uses_spark_cluster(path) else None
    run = DocRun(tmp_path, spark_master=master)
    try:
        runnable = [b for b in doc if b.runs]
        if runnable and not any(b.starts_servers for b in runnable):
            run.start_cluster()
        for block in doc:
            if block.lang in CHECKED and "skip" not in block.directives:
                check_data_block(block.lang, block.text, block.where, run)
            elif block.runs:
                run.run(block)
        run.run_tests()
    finally:
        problems = run.close()
        print("\n".join(f"{where}: {seconds:.1f}s" for where, seconds in run.timings))
    assert not problems, problems


def check_data_block(lang: str, text: str, where: str, run: DocRun) -> None:
    """JSON must parse; TOML must parse, and pytest options in it must be ones pytest and
    nsqpy's plugin know, with values the fixtures start servers with."""
    import json
    import tomllib

    if lang == "json":
        json.loads(text)
        return
    data = tomllib.loads(text)
    if "pytest" in data.get("tool", {}):
        check_pytest_options(text, where, run)


def check_pytest_options(toml: str, where: str, run: DocRun) -> None:
    project = run.tmp / f"toml-{where.replace(':', '-')}"
    project.mkdir()
    (project / "pyproject.toml").write_text(toml)
    (project / "test_options.py").write_text(
        "def test_fixtures_start_with_these_options(nsqd, nsq_cluster):\n"
        "    assert nsqd.stats()['topics'] == []\n"
    )
    script = f"cd {project} && {REPO / '.venv/bin/python'} -m pytest -q -p no:cacheprovider"
    run.shell(where, f"{script} -W error::pytest.PytestConfigWarning .", project)


# -- the rules the docs are held to -------------------------------------------------------------


def test_every_block_has_a_language_and_every_skip_a_reason() -> None:
    """Read every doc: a block without a language, or a skip marker without a reason, is
    refused here (by blocks()), so that no block silently escapes the runs above."""
    for path in DOCS:
        blocks(path)


def test_markers_are_checked(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- doc-test: skip -->\n```sh\ntrue\n```\n")
    with pytest.raises(DocError, match="must say why"):
        blocks(doc)
    doc.write_text("```\nuntagged\n```\n")
    with pytest.raises(DocError, match="language"):
        blocks(doc)
    doc.write_text("<!-- doc-test: skip: needs a GPU -->\n```sh\nfalse\n```\n")
    assert [b.runs for b in blocks(doc)] == [False]
