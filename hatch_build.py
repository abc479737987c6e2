"""Wheel build hook: nsqd's hot modules compiled with mypyc, from the same Python source.

A wheel built here carries, beside every ``.py`` file, a C extension for each module of
COMPILED (Python imports the extension first). mypyc compiles the typed source as it is,
as mypy and black ship: no second implementation. Where it cannot (no C compiler, no
Python headers, a platform mypyc does not support) the build says so and the wheel is the
pure-Python one: installing from the sdist never fails for want of a compiler.

``NSQPY_PURE_PYTHON=1`` builds the pure-Python wheel on purpose. Editable installs (the
development environment, ``uv sync``) are always pure Python, so that an edit to a module
takes effect without a rebuild.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# The modules every published message passes through: parse, engine, queues, delivery; and
# those of an HTTP publish: the server, NSQ's http_api and router, nsqd's routes.
COMPILED = [
    "nsqpy/wire/v2.py",
    "nsqpy/nsqd/message.py",
    "nsqpy/nsqd/backend.py",
    "nsqpy/nsqd/channel.py",
    "nsqpy/nsqd/topic.py",
    "nsqpy/nsqd/nsqd.py",
    "nsqpy/nsqd/protocol_v2.py",
    "nsqpy/nsqd/tls.py",  # its parser subclasses wire.v2's: interpreted code cannot
    "nsqpy/diskqueue/diskqueue.py",
    "nsqpy/common/httpserver.py",
    "nsqpy/common/httpapi.py",
    "nsqpy/nsqd/http_api.py",
    "nsqpy/common/idlepoll.py",  # the event loop's polling turns between round trips
]

# mypy's own checks are not repeated here (the test command runs mypy): third-party modules
# without types in the build environment (aiohttp, uvloop) are Any to the compiler.
MYPY_FLAGS = ["--ignore-missing-imports", "--follow-imports=silent"]


class MypycBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        if os.environ.get("NSQPY_PURE_PYTHON", "") not in ("", "0"):
            self.app.display_info("nsqpy: NSQPY_PURE_PYTHON is set: a pure-Python wheel")
            return
        work = Path(tempfile.mkdtemp(prefix="nsqpy-mypyc-"))
        try:
            built = self._compile(work)
        except BaseException as err:  # SystemExit from distutils, CompileError, ImportError
            shutil.rmtree(work, ignore_errors=True)
            self.app.display_warning(
                f"nsqpy: compiling with mypyc failed ({type(err).__name__}: {err});"
                " building the pure-Python wheel, which works the same, only slower"
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        for path in built:
            build_data["force_include"][str(path)] = str(path.relative_to(work / "lib"))
        self._work = work
        self.app.display_info(f"nsqpy: compiled {len(COMPILED)} modules with mypyc")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        work = getattr(self, "_work", None)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)

    def _compile(self, work: Path) -> list[Path]:
        from mypyc.build import mypycify
        from setuptools import Distribution

        root = Path(self.root)
        cwd = os.getcwd()
        os.chdir(root)  # mypycify takes paths relative to the project
        try:
            extensions = mypycify(
                [*MYPY_FLAGS, *COMPILED], opt_level="3", target_dir=str(work / "c")
            )
            dist = Distribution({"name": "nsqpy", "ext_modules": extensions})
            build_ext = dist.get_command_obj("build_ext")
            build_ext.build_lib = str(work / "lib")  # type: ignore[attr-defined]
            build_ext.build_temp = str(work / "tmp")  # type: ignore[attr-defined]
            build_ext.parallel = os.cpu_count() or 1  # type: ignore[attr-defined]
            dist.run_command("build_ext")
        finally:
            os.chdir(cwd)
        built = sorted((work / "lib").rglob("*.so")) + sorted((work / "lib").rglob("*.pyd"))
        if len(built) < len(COMPILED):
            raise RuntimeError(f"expected {len(COMPILED)} extensions, got {len(built)}")
        return built
