"""The wheel alone: ``uv build``, install into a fresh virtual environment with nothing
of this repository on the path, then run its console scripts as a user would.

``NSQPY_UV`` may name the uv command (scripts/test.sh sets it); otherwise ``uv`` on PATH,
else ``python3 -m uv``. Dependencies come from uv's cache, or PyPI for what is missing.
``NSQPY_DIST`` may name a directory where this interpreter's sdist and wheel are already
built (scripts/test.sh builds them once for the 3.11 run).

The wheel is built from the sdist with nsqd's hot modules compiled by mypyc
(hatch_build.py); where no compiler is at hand it is the pure-Python wheel instead.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from nsqpy.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def _uv() -> list[str]:
    if os.environ.get("NSQPY_UV"):
        return shlex.split(os.environ["NSQPY_UV"])
    if shutil.which("uv"):
        return ["uv"]
    return [shutil.which("python3") or "python3", "-m", "uv"]


def _run(*argv: str | Path, cwd: Path, timeout: float = 240) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (this interpreter's version) with only the built wheel in it."""
    tmp = tmp_path_factory.mktemp("wheel")
    uv = _uv()
    dist = Path(os.environ.get("NSQPY_DIST") or tmp / "dist")
    if not os.environ.get("NSQPY_DIST"):
        _run(*uv, "build", "--quiet", "--python", sys.executable, "--out-dir", dist, ROOT, cwd=tmp)
    built = sorted(p.name for p in dist.iterdir() if p.name.startswith("nsqpy-"))
    assert len(built) == 2 and built[0].endswith(".whl") and built[1].endswith(".tar.gz"), built
    _run(*uv, "venv", "--quiet", "--python", sys.executable, tmp / "venv", cwd=tmp)
    wheel = dist / built[0]
    _run(*uv, "pip", "install", "--quiet", "--python", tmp / "venv/bin/python", wheel, cwd=tmp)
    return tmp / "venv"


def _compiled_modules() -> list[str]:
    """hatch_build.py's COMPILED, as module names."""
    source = (ROOT / "hatch_build.py").read_text()
    paths = re.findall(r'"(nsqpy/[\w/]+)\.py"', source.split("COMPILED = [", 1)[1].split("]", 1)[0])
    assert paths
    return [p.replace("/", ".") for p in paths]


def test_wheel_runs_nsqd_compiled(venv: Path) -> None:
    """Every module of COMPILED is imported from its C extension, where a compiler is at
    hand (in CI always: a pure-Python wheel there is a failure)."""
    modules = _compiled_modules()
    code = f"import importlib; print([importlib.import_module(m).__file__ for m in {modules!r}])"
    files = ast.literal_eval(_run(venv / "bin/python", "-P", "-c", code, cwd=venv.parent))
    compiled = [f for f in files if f.endswith(".so")]
    if not compiled and not os.environ.get("CI") and not shutil.which("cc"):
        pytest.skip("no C compiler here: the wheel is the pure-Python one")
    assert compiled == files, files


def test_compiled_idle_poll_runs_its_trial(venv: Path) -> None:
    """The idle poll's trial between polling and sleeping (nsqpy/common/idlepoll.py) needs
    a load of thousands of reads a second, which no protocol test makes: the unit tests'
    simulation runs here against the wheel's module (compiled, where a compiler was)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from idlepoll_sim import constant, simulate;"
        "from nsqpy.common.idlepoll import IdlePoll;"
        "print([simulate(IdlePoll, 2.0, constant(p, s), constant(30e-6, 30e-6))[1][-1][1]"
        " for p, s in ((40_000, 27_000), (27_000, 40_000))])"
    )
    out = _run(venv / "bin/python", "-P", "-c", code, ROOT / "tests/unit", cwd=venv.parent)
    assert out.split() == ["[True,", "False]"]  # the faster mode kept, either way


def test_a_failed_compile_builds_the_pure_wheel(tmp_path: Path) -> None:
    """No compiler (CC that fails): the build says so and makes the pure-Python wheel; an
    install from the sdist never fails for want of one."""
    env_cc = {"CC": "false", "NSQPY_PURE_PYTHON": ""}
    proc = subprocess.run(
        [*_uv(), "build", "--wheel", "--python", sys.executable, "--out-dir", tmp_path, ROOT],
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, **env_cc},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "compiling with mypyc failed" in proc.stderr + proc.stdout
    (wheel,) = tmp_path.glob("nsqpy-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        assert not [n for n in archive.namelist() if n.endswith(".so")]
        assert "nsqpy/nsqd/protocol_v2.py" in archive.namelist()


def _server(venv: Path, name: str, *args: str, ready: tuple[str, ...]) -> ServerProcess:
    server = ServerProcess(name, [str(venv / "bin" / name), *args], ready=ready, cwd=venv.parent)
    server.wait_ready(30)
    return server


def test_wheel_servers_tools_and_nsqadmin_ui(venv: Path) -> None:
    bin_ = venv / "bin"
    code = "import nsqpy, nsqpy.nsqd.server, nsqpy.testing; print(nsqpy.__file__)"
    location = _run(bin_ / "python", "-c", code, cwd=venv.parent)
    assert location.startswith(str(venv)), location  # the wheel's, not this checkout's
    assert "nsqpy-0.1.0" in _run(bin_ / "nsqd", "--version", cwd=venv.parent)
    local = ("--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0")
    servers: list[ServerProcess] = []
    try:
        lookupd = _server(
            venv, "nsqlookupd", *local, "--broadcast-address=127.0.0.1", ready=("tcp", "http")
        )
        servers.append(lookupd)
        nsqd = _server(
            venv,
            "nsqd",
            *local,
            f"--data-path={venv.parent}",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--broadcast-address=127.0.0.1",
            ready=("tcp",),
        )
        servers.append(nsqd)
        admin = _server(
            venv,
            "nsqadmin",
            "--http-address=127.0.0.1:0",
            f"--lookupd-http-address={lookupd.http_address}",
            ready=("http",),
        )
        servers.append(admin)
        subprocess.run(
            [bin_ / "to_nsq", "--topic=wheel", f"--nsqd-tcp-address={nsqd.tcp_address}"],
            input=b"one\ntwo\n",
            check=True,
            timeout=30,
        )
        # and one by HTTP (nsqd's compiled HTTP server and routes)
        pub = urllib.request.Request(
            f"http://{nsqd.address('http')}/pub?topic=wheel", data=b"three", method="POST"
        )
        with urllib.request.urlopen(pub, timeout=10) as resp:
            assert (resp.status, resp.read()) == (200, b"OK")
        tail = _run(
            bin_ / "nsq_tail",
            "--topic=wheel",
            f"--lookupd-http-address={lookupd.http_address}",
            "-n",
            "3",
            cwd=venv.parent,
            timeout=30,
        )
        assert tail.splitlines()[-3:] == ["one", "two", "three"], tail
        base = f"http://{admin.address('http')}"
        with urllib.request.urlopen(f"{base}/", timeout=10) as resp:
            page = resp.read().decode()
        assert "static/js/main.js" in page
        for asset in ("static/js/main.js", "static/css/app.css"):
            with urllib.request.urlopen(f"{base}/{asset}", timeout=10) as resp:
                assert resp.status == 200 and len(resp.read()) > 100, asset
        with urllib.request.urlopen(f"{base}/api/topics", timeout=10) as resp:
            assert "wheel" in json.loads(resp.read())["topics"]
    finally:
        for server in reversed(servers):
            assert server.stop() == 0, server.log_text()


def _locked(*names: str) -> list[str]:
    """``name==version`` for ``names`` as uv.lock pins them."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    pins = {p["name"]: p["version"] for p in lock["package"]}
    return [f"{name}=={pins[name]}" for name in names]


def test_wheel_spark_extra(venv: Path) -> None:
    python = venv / "bin/python"
    # pyspark is a 450 MB sdist: uv resolving it anew takes a minute, so the locked
    # versions come first from uv's cache (where `uv sync` put them), offline, if there.
    subprocess.run(
        [*_uv(), "pip", "install", "--quiet", "--offline", "--no-deps", "--python", python,
         *_locked("pyspark", "py4j", "pyarrow")],
        cwd=venv.parent, capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    wheel = next(Path(os.environ.get("NSQPY_DIST") or venv.parent / "dist").glob("nsqpy-*.whl"))
    _run(
        *_uv(), "pip", "install", "--quiet", "--python", python, f"{wheel}[spark]", cwd=venv.parent
    )
    code = (
        "import pyarrow, pyspark; from nsqpy.spark import NSQDataSource; "
        "print(NSQDataSource.name(), pyspark.__version__)"
    )
    assert _run(python, "-c", code, cwd=venv.parent).split() == ["nsq", "4.3.0"]
