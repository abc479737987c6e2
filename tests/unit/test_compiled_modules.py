"""What mypyc needs of the modules hatch_build.py compiles, checked on the source tree.

Two things the type checker accepts and the compiled wheel does not, each found by running
the suite against it:

- A class compiled by mypyc cannot be subclassed by interpreted code ("interpreted classes
  cannot inherit from compiled"): that fails on the one path that makes the subclass
  (TLSRequiredParser did, at --tls-required). So every subclass of a class of a compiled
  module lives in a compiled module too.
- mypyc gives a local variable one type for the whole function: ``except ProtocolError as
  err`` and, further on, ``except ConnectionFailure as err`` make the second clause fail with
  "TypeError: ProtocolError object expected" instead of handling the error (a failed TLS
  handshake went unlogged so). So one name per exception type in a function.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import nsqpy

ROOT = Path(__file__).resolve().parents[2]


def compiled_modules() -> set[str]:
    source = (ROOT / "hatch_build.py").read_text()
    listed = source.split("COMPILED = [", 1)[1].split("]", 1)[0]
    return {p.replace("/", ".") for p in re.findall(r'"(nsqpy/[\w/]+)\.py"', listed)}


def test_compiled_modules_exist() -> None:
    for name in compiled_modules():
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name


def test_no_interpreted_subclass_of_a_compiled_class() -> None:
    compiled = compiled_modules()
    for info in pkgutil.walk_packages(nsqpy.__path__, "nsqpy."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            importlib.import_module(info.name)
    offenders = []
    for name in sorted(compiled):
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != name:
                continue
            stack = list(cls.__subclasses__())
            while stack:
                sub = stack.pop()
                stack.extend(sub.__subclasses__())
                if sub.__module__.startswith("nsqpy.") and sub.__module__ not in compiled:
                    offenders.append(f"{sub.__module__}.{sub.__qualname__} <- {name}.{cls.__name__}")
    assert not offenders, "add these modules to hatch_build.COMPILED: " + "; ".join(offenders)


def test_one_exception_type_per_name_in_a_function() -> None:
    clashes = []
    for name in sorted(compiled_modules()):
        path = ROOT / (name.replace(".", "/") + ".py")
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            types: dict[str, set[str]] = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.ExceptHandler) and node.name:
                    kind = ast.unparse(node.type) if node.type else "BaseException"
                    types.setdefault(node.name, set()).add(kind)
            clashes += [
                f"{path.name}:{fn.lineno} {fn.name}(): {var} <- {sorted(kinds)}"
                for var, kinds in types.items()
                if len(kinds) > 1
            ]
    assert not clashes, clashes
