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

And two that fail the compile itself, whereupon the build makes the pure-Python wheel (which
tests/e2e/test_wheel.py would only tell at the end of a build): a class deriving from a
builtin type other than the few mypyc can subclass (``class BodyError(ConnectionError)``:
"Inheriting from most builtin types is unimplemented"), and a class body assigning to
anything but a plain name (``_A, _B = range(2)``).
"""

from __future__ import annotations

import abc
import ast
import builtins
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
                    offenders.append(
                        f"{sub.__module__}.{sub.__qualname__} <- {name}.{cls.__name__}"
                    )
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


# mypyc.irbuild.prepare.can_subclass_builtin, with BaseException and dict, special-cased there
_SUBCLASSABLE_BUILTINS = {
    "object",
    "BaseException",
    "Exception",
    "LookupError",
    "IndexError",
    "Warning",
    "UserWarning",
    "ValueError",
    "dict",
}


def _compiled_classes() -> list[type]:
    """The classes of the compiled modules that mypyc compiles as native ones (not enums,
    named tuples or other classes with their own metaclass)."""
    classes = []
    for name in sorted(compiled_modules()):
        for cls in vars(importlib.import_module(name)).values():
            native = inspect.isclass(cls) and type(cls) in (type, abc.ABCMeta)
            if native and cls.__module__ == name and not hasattr(cls, "_fields"):
                classes.append(cls)
    return classes


def test_no_compiled_class_derives_from_a_builtin_mypyc_cannot_subclass() -> None:
    offenders = [
        f"{cls.__module__}.{cls.__qualname__} <- {base.__name__}"
        for cls in _compiled_classes()
        for base in cls.__mro__[1:]
        if getattr(builtins, base.__name__, None) is base
        and base.__name__ not in _SUBCLASSABLE_BUILTINS
    ]
    assert not offenders, offenders


def test_class_bodies_assign_plain_names_only() -> None:
    offenders = []
    for name in sorted(compiled_modules()):
        path = ROOT / (name.replace(".", "/") + ".py")
        for cls in ast.walk(ast.parse(path.read_text())):
            if isinstance(cls, ast.ClassDef):
                offenders += [
                    f"{path.name}:{node.lineno} {cls.name}: {ast.unparse(node)}"
                    for node in cls.body
                    if isinstance(node, ast.Assign)
                    and not all(isinstance(target, ast.Name) for target in node.targets)
                ]
    assert not offenders, offenders
