"""Go-style command line and config file handling shared by every nsqpy binary.

NSQ's binaries parse their options with Go's ``flag`` package, then merge a
TOML ``--config`` file in with ``github.com/mreiferson/go-options``.  This
module reproduces both so that nsqpy accepts the same command lines and config
files:

* options are a ``@dataclass`` whose fields are declared with :func:`flag`,
  carrying the Go flag name, the TOML key and the help text;
* :func:`parse_args` parses ``argv`` with Go ``flag`` semantics, loads the
  config file and resolves each field as explicit flag > config file > default;
* :func:`parse_duration` / :func:`format_duration` are Go's
  ``time.ParseDuration`` and ``time.Duration.String`` (durations are float
  seconds in Python);
* :func:`option_by_cfg_name` is the ``/config/<opt>`` lookup of the HTTP API.

Exceptions::

    GoFlagsError
     ├── FlagError       bad command line (Go ``flag`` package wording)
     ├── HelpRequested   -h / --help was given; carries the usage text
     ├── ConfigError     config file missing, unreadable or holding bad values
     └── OptionsError    startup validation of the resolved options failed
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, overload

import nsqpy
from nsqpy.common.log import LogLevel
from nsqpy.wire.names import go_quote

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "ConfigError",
    "FlagError",
    "FlagSpec",
    "GoFlagsError",
    "HelpRequested",
    "Kind",
    "LogLevel",
    "OptionRef",
    "OptionsError",
    "ParseResult",
    "Source",
    "exit_on_error",
    "flag",
    "flag_specs",
    "format_duration",
    "format_duration_ns",
    "go_format_float",
    "go_quote",
    "load_config_file",
    "option_by_cfg_name",
    "parse_args",
    "parse_duration",
    "parse_duration_ns",
    "parse_go_bool",
    "parse_go_float",
    "parse_go_int",
    "seconds_to_ns",
    "usage",
    "version_string",
]

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")

_METADATA_KEY = "nsqpy.goflags"


# --------------------------------------------------------------------------- errors


class GoFlagsError(Exception):
    """Base class of every error raised while building options."""


class FlagError(GoFlagsError):
    """The command line is invalid; the message is worded like Go's ``flag`` package.

    ``usage`` holds the usage text, which Go prints after the message.
    """

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage


class HelpRequested(GoFlagsError):
    """``-h`` / ``-help`` was given: print ``usage`` and exit 0."""

    def __init__(self, usage: str) -> None:
        super().__init__("flag: help requested")
        self.usage = usage


class ConfigError(GoFlagsError):
    """The ``--config`` file could not be read, or one of its values is unusable."""


class OptionsError(GoFlagsError):
    """Resolved options failed a startup validation (e.g. ``--node-id must be [0,1024)``)."""


def exit_on_error(err: GoFlagsError) -> NoReturn:
    """Report ``err`` on stderr the way nsqpy binaries do and exit the process.

    Help exits 0 after printing the usage; every other error exits 1 (Go uses 2
    for flag errors; nsqpy deliberately does not).
    """
    if isinstance(err, HelpRequested):
        sys.stderr.write(err.usage)
        sys.exit(0)
    sys.stderr.write(f"{err}\n")
    if isinstance(err, FlagError) and err.usage:
        sys.stderr.write(err.usage)
    sys.exit(1)


def version_string(app_name: str) -> str:
    """The ``--version`` line, e.g. ``nsqd v1.3.0 (built w/nsqpy-0.1.0)``."""
    return f"{app_name} v{nsqpy.NSQ_VERSION} (built w/nsqpy-{nsqpy.__version__})"


# --------------------------------------------------------------------------- log levels


# --------------------------------------------------------------------------- Go scalars


def parse_go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``: 1 t T TRUE true True / 0 f F FALSE false False."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError("parse error")


def _underscore_ok(text: str) -> bool:
    # Go's strconv.underscoreOK: '_' only between digits or after a base prefix.
    saw = "^"
    i = 0
    if text[:1] in ("+", "-"):
        text = text[1:]
    hexa = False
    if len(text) >= 2 and text[0] == "0" and text[1].lower() in "box":
        i = 2
        saw = "0"
        hexa = text[1].lower() == "x"
    while i < len(text):
        ch = text[i]
        if "0" <= ch <= "9" or (hexa and "a" <= ch.lower() <= "f"):
            saw = "0"
        elif ch == "_":
            if saw != "0":
                return False
            saw = "_"
        else:
            if saw == "_":
                return False
            saw = "!"
        i += 1
    return saw != "_"


_INT64_MAX = (1 << 63) - 1


def parse_go_int(text: str, *, base: int = 0) -> int:
    """Go's ``strconv.ParseInt(text, base, 64)``.

    With ``base=0`` (what Go's ``flag`` package uses) the literal may carry a
    ``0x``/``0o``/``0b`` prefix, a leading ``0`` means octal and ``_`` may
    separate digits.  Raises ``ValueError("parse error")`` or
    ``ValueError("value out of range")`` like the ``flag`` package reports them.
    """
    syntax = ValueError("parse error")
    whole = text
    if not text:
        raise syntax
    negative = False
    if text[0] in "+-":
        negative = text[0] == "-"
        text = text[1:]
        if not text:
            raise syntax
    base0 = base == 0
    if base0:
        base = 10
        if text[0] == "0":
            if len(text) >= 3 and text[1].lower() in "box":
                base = {"b": 2, "o": 8, "x": 16}[text[1].lower()]
                text = text[2:]
            else:
                base = 8
                text = text[1:]
    underscores = False
    value = 0
    for ch in text:
        if ch == "_" and base0:
            underscores = True
            continue
        if "0" <= ch <= "9":
            digit = ord(ch) - ord("0")
        elif "a" <= ch.lower() <= "z":
            digit = ord(ch.lower()) - ord("a") + 10
        else:
            raise syntax
        if digit >= base:
            raise syntax
        value = value * base + digit
    if underscores and not _underscore_ok(whole.lstrip("+-")):
        raise syntax
    if (not negative and value > _INT64_MAX) or (negative and value > _INT64_MAX + 1):
        raise ValueError("value out of range")
    return -value if negative else value


_DIGITS = r"[0-9](?:_?[0-9])*"
_HEX_DIGITS = r"[0-9a-fA-F](?:_?[0-9a-fA-F])*"
_DEC_FLOAT = re.compile(
    rf"[+-]?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?"
)
_HEX_FLOAT = re.compile(
    rf"[+-]?0[xX](?:_?{_HEX_DIGITS}(?:\.(?:{_HEX_DIGITS})?)?|\.{_HEX_DIGITS})[pP][+-]?{_DIGITS}"
)
_SPECIAL_FLOAT = re.compile(r"[+-]?(?:inf|infinity)|nan", re.IGNORECASE)


def parse_go_float(text: str) -> float:
    """Go's ``strconv.ParseFloat(text, 64)`` (no surrounding whitespace allowed)."""
    if _SPECIAL_FLOAT.fullmatch(text):
        return float(text)
    if _DEC_FLOAT.fullmatch(text):
        value = float(text.replace("_", ""))
    elif _HEX_FLOAT.fullmatch(text):
        value = float.fromhex(text.replace("_", ""))
    else:
        raise ValueError("parse error")
    if math.isinf(value):
        raise ValueError("value out of range")
    return value


def go_format_float(value: float) -> str:
    """Format a float like Go's ``%v`` verb (``2`` not ``2.0``, ``1e-05``, ``+Inf``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    shortest = repr(value)
    exponent = Decimal(shortest).adjusted()
    if exponent < -4 or exponent >= 21:
        # repr switches to e-notation earlier than Go; above 1e21 both agree.
        return shortest
    return format(Decimal(shortest).normalize(), "f")


# --------------------------------------------------------------------------- durations

_NANOSECOND = 1
_MICROSECOND = 1000 * _NANOSECOND
_MILLISECOND = 1000 * _MICROSECOND
_SECOND = 1000 * _MILLISECOND
_MINUTE = 60 * _SECOND
_HOUR = 60 * _MINUTE

_DURATION_UNITS = {
    "ns": _NANOSECOND,
    "us": _MICROSECOND,
    "\u00b5s": _MICROSECOND,  # micro sign
    "\u03bcs": _MICROSECOND,  # Greek mu
    "ms": _MILLISECOND,
    "s": _SECOND,
    "m": _MINUTE,
    "h": _HOUR,
}


def _time_quote(text: str) -> str:
    # time.quote: unlike strconv.Quote, non-ASCII is escaped byte by byte.
    out = ['"']
    for ch in text:
        if ord(ch) >= 0x80 or ch < " ":
            out.extend(f"\\x{byte:02x}" for byte in ch.encode("utf-8", "surrogatepass"))
        else:
            if ch in ('"', "\\"):
                out.append("\\")
            out.append(ch)
    out.append('"')
    return "".join(out)


def parse_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration``, returning integer nanoseconds.

    Accepts ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`` with units ns, us, µs, ms, s, m,
    h; a bare ``0`` is the only unit-less value.  Errors carry Go's messages,
    e.g. ``time: missing unit in duration "1"``.
    """
    orig = text
    invalid = ValueError(f"time: invalid duration {_time_quote(orig)}")
    negative = False
    if text and text[0] in "+-":
        negative = text[0] == "-"
        text = text[1:]
    if text == "0":
        return 0
    if not text:
        raise invalid
    total = 0
    limit = 1 << 63
    while text:
        if not (text[0] == "." or "0" <= text[0] <= "9"):
            raise invalid
        i = 0
        whole = 0
        while i < len(text) and "0" <= text[i] <= "9":
            if whole > limit // 10:
                raise invalid
            whole = whole * 10 + ord(text[i]) - ord("0")
            if whole > limit:
                raise invalid
            i += 1
        had_whole = i > 0
        text = text[i:]

        fraction = 0
        scale = 1.0
        had_fraction = False
        if text and text[0] == ".":
            text = text[1:]
            i = 0
            overflow = False
            while i < len(text) and "0" <= text[i] <= "9":
                if not overflow:
                    # Like Go, stop gaining precision rather than failing.
                    if fraction > (limit - 1) // 10:
                        overflow = True
                    else:
                        nxt = fraction * 10 + ord(text[i]) - ord("0")
                        if nxt > limit:
                            overflow = True
                        else:
                            fraction = nxt
                            scale *= 10
                i += 1
            had_fraction = i > 0
            text = text[i:]
        if not had_whole and not had_fraction:
            raise invalid

        i = 0
        while i < len(text) and not (text[i] == "." or "0" <= text[i] <= "9"):
            i += 1
        if i == 0:
            raise ValueError(f"time: missing unit in duration {_time_quote(orig)}")
        unit_name, text = text[:i], text[i:]
        unit = _DURATION_UNITS.get(unit_name)
        if unit is None:
            raise ValueError(
                f"time: unknown unit {_time_quote(unit_name)} in duration {_time_quote(orig)}"
            )
        if whole > limit // unit:
            raise invalid
        whole *= unit
        if fraction > 0:
            # Go does this step in float64 too; matching it keeps results bit-identical.
            whole += int(float(fraction) * (float(unit) / scale))
            if whole > limit:
                raise invalid
        total += whole
        if total > limit:
            raise invalid
    if negative:
        return -total
    if total > limit - 1:
        raise invalid
    return total


def parse_duration(text: str) -> float:
    """Go's ``time.ParseDuration``, returning float seconds (see :func:`parse_duration_ns`)."""
    return parse_duration_ns(text) / _SECOND


def seconds_to_ns(seconds: float) -> int:
    """Float seconds to Go's ``time.Duration`` (integer nanoseconds)."""
    return round(seconds * _SECOND)


def _fmt_frac(value: int, precision: int) -> tuple[str, int]:
    digits = ""
    for _ in range(precision):
        value, digit = divmod(value, 10)
        if digits or digit:
            digits = str(digit) + digits
    return ("." + digits if digits else ""), value


def format_duration_ns(ns: int) -> str:
    """Go's ``time.Duration.String()`` for integer nanoseconds: ``1m30s``, ``250ms``, ``0s``."""
    negative = ns < 0
    u = -ns if negative else ns
    if u < _SECOND:
        if u == 0:
            return "0s"
        if u < _MICROSECOND:
            text = f"{u}ns"
        elif u < _MILLISECOND:
            frac, whole = _fmt_frac(u, 3)
            text = f"{whole}{frac}\u00b5s"
        else:
            frac, whole = _fmt_frac(u, 6)
            text = f"{whole}{frac}ms"
    else:
        frac, secs = _fmt_frac(u, 9)
        text = f"{secs % 60}{frac}s"
        minutes = secs // 60
        if minutes > 0:
            text = f"{minutes % 60}m{text}"
            hours = minutes // 60
            if hours > 0:
                text = f"{hours}h{text}"
    return "-" + text if negative else text


def format_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()`` for float seconds: ``1m30s``, ``250ms``, ``2h0m0s``."""
    return format_duration_ns(seconds_to_ns(seconds))


# --------------------------------------------------------------------------- declarations


class Kind(enum.Enum):
    """How a flag's text is parsed, how config values are coerced, how it is shown."""

    STRING = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    DURATION = "duration"  # float seconds in Python, time.Duration in Go
    STRING_LIST = "string list"  # repeatable; Go's app.StringArray
    FLOAT_LIST = "float list"  # repeatable, comma lists allowed; Go's app.FloatArray
    VALUE = "value"  # custom flag.Value: needs ``parse``


class Source(enum.Enum):
    """Where a resolved option value came from."""

    DEFAULT = "default"
    CONFIG = "config"
    FLAG = "flag"


@dataclass(frozen=True)
class FlagSpec:
    """Everything :func:`flag` records about one option field."""

    name: str
    """Go flag name, without dashes (``tcp-address``)."""
    help: str
    kind: Kind
    cfg: str | None
    """TOML / ``/config`` key; None for flags Go keeps out of its Options struct."""
    parse: Callable[[str], Any] | None = None
    """Custom ``Set`` for ``Kind.VALUE``; raises ValueError with Go's error text."""
    is_bool: bool = False
    """Takes no separate value (``--flag`` means ``--flag=true``)."""
    show: Callable[[Any], str] | None = None
    """Renders a value for the usage text's ``(default ...)``."""
    go_value: Callable[[Any], Any] | None = None
    """Converts the Python value to what Go would JSON-encode, for custom kinds."""
    attr: str = ""
    """Python attribute name; filled in by :func:`flag_specs`."""

    @property
    def takes_value(self) -> bool:
        """Whether ``-flag value`` consumes the next argument."""
        return not (self.kind is Kind.BOOL or self.is_bool)


@overload
def flag(
    name: str,
    default: T,
    *,
    help: str,
    kind: Kind,
    cfg: str | None = None,
    parse: Callable[[str], Any] | None = None,
    is_bool: bool = False,
    show: Callable[[Any], str] | None = None,
    go_value: Callable[[Any], Any] | None = None,
) -> T: ...


@overload
def flag(
    name: str,
    *,
    default_factory: Callable[[], T],
    help: str,
    kind: Kind,
    cfg: str | None = None,
    parse: Callable[[str], Any] | None = None,
    is_bool: bool = False,
    show: Callable[[Any], str] | None = None,
    go_value: Callable[[Any], Any] | None = None,
) -> T: ...


def flag(
    name: str,
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    help: str,
    kind: Kind,
    cfg: str | None = None,
    parse: Callable[[str], Any] | None = None,
    is_bool: bool = False,
    show: Callable[[Any], str] | None = None,
    go_value: Callable[[Any], Any] | None = None,
) -> Any:
    """Declare a dataclass field that is also a Go-style command line flag.

    ``cfg`` is the TOML key; it defaults to the flag name with ``-`` → ``_``.
    Pass ``cfg=""`` for a flag with no config key (deprecated no-op flags).
    """
    if kind is Kind.VALUE and parse is None:
        raise TypeError(f"flag {name!r}: Kind.VALUE needs a parse function")
    cfg_key = name.replace("-", "_") if cfg is None else (cfg or None)
    spec = FlagSpec(
        name=name,
        help=help,
        kind=kind,
        cfg=cfg_key,
        parse=parse,
        is_bool=is_bool,
        show=show,
        go_value=go_value,
    )
    metadata = {_METADATA_KEY: spec}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# -- flags every NSQ binary declares the same way -------------------------------------------


def log_level_flag() -> Any:
    """``--log-level``, as every NSQ binary declares it."""
    return flag(
        "log-level",
        LogLevel.INFO,
        kind=Kind.VALUE,
        parse=LogLevel.parse,
        show=lambda level: level.name,
        help="set log verbosity: debug, info, warn, error, or fatal",
    )


def log_prefix_flag(prefix: str) -> Any:
    """``--log-prefix`` with the binary's own default (``"[nsqd] "``, ...)."""
    return flag("log-prefix", prefix, kind=Kind.STRING, help="log message prefix")


def verbose_flag() -> Any:
    """``--verbose``: deprecated, accepted and ignored (pynsq's test harness passes it)."""
    return flag(
        "verbose", False, kind=Kind.BOOL, cfg="", help="[deprecated] has no effect, use --log-level"
    )


def http_client_connect_timeout_flag(default: float = 2.0) -> Any:
    return flag(
        "http-client-connect-timeout", default, kind=Kind.DURATION, help="timeout for HTTP connect"
    )


def http_client_request_timeout_flag(default: float = 5.0) -> Any:
    return flag(
        "http-client-request-timeout", default, kind=Kind.DURATION, help="timeout for HTTP request"
    )


def flag_specs(cls: type[DataclassInstance] | DataclassInstance) -> list[FlagSpec]:
    """The flags declared on an options dataclass (fields without :func:`flag` are skipped)."""
    specs = []
    for fld in dataclasses.fields(cls):
        spec = fld.metadata.get(_METADATA_KEY)
        if isinstance(spec, FlagSpec):
            specs.append(dataclasses.replace(spec, attr=fld.name))
    return specs


_VERSION_SPEC = FlagSpec("version", "print version string", Kind.BOOL, None, attr="version")
_CONFIG_SPEC = FlagSpec("config", "path to config file", Kind.STRING, None, attr="config")


def _builtin_specs(config_flag: bool, version_flag: bool) -> list[FlagSpec]:
    specs = []
    if config_flag:
        specs.append(_CONFIG_SPEC)
    if version_flag:
        specs.append(_VERSION_SPEC)
    return specs


# --------------------------------------------------------------------------- values


def _parse_scalar(spec: FlagSpec, text: str) -> Any:
    """A flag's ``Set(text)``: ValueError carries Go's error text."""
    if spec.parse is not None:
        return spec.parse(text)
    if spec.kind is Kind.STRING:
        return text
    if spec.kind is Kind.INT:
        return parse_go_int(text)
    if spec.kind is Kind.FLOAT:
        return parse_go_float(text)
    if spec.kind is Kind.BOOL:
        return parse_go_bool(text)
    if spec.kind is Kind.DURATION:
        try:
            return parse_duration(text)
        except ValueError:
            raise ValueError("parse error") from None
    raise AssertionError(f"not a scalar kind: {spec.kind}")


def _go_sprint(value: object) -> str:
    # fmt.Sprintf("%v", v) for the TOML scalars Go's cfg.Validate() stringifies.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_format_float(value)
    return str(value)


def _toml_repr(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return go_quote(value)
    return repr(value)


def _coerce_config(spec: FlagSpec, value: object) -> Any:
    """go-options' ``coerce``: a TOML value for ``spec``; ValueError says why not."""
    kind = spec.kind
    if spec.parse is not None:
        if isinstance(value, (list, dict)):
            raise ValueError(f"expected a scalar, got {type(value).__name__}")
        return spec.parse(_go_sprint(value))
    if kind is Kind.STRING:
        if not isinstance(value, str):
            raise ValueError("expected a string")
        return value
    if kind is Kind.INT:
        if isinstance(value, str):
            return parse_go_int(value, base=10)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError("expected an integer")
    if kind is Kind.FLOAT:
        if isinstance(value, str):
            return parse_go_float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError("expected a number")
    if kind is Kind.BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_go_bool(value)
        # go-options maps integers to (n == 0), i.e. inverted; refuse rather than copy that.
        raise ValueError("expected a boolean")
    if kind is Kind.DURATION:
        if isinstance(value, str):
            return parse_duration(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value / 1000  # go-options reads bare integers as milliseconds
        raise ValueError('expected a duration string such as "1m30s" or integer milliseconds')
    if kind is Kind.STRING_LIST:
        if isinstance(value, str):
            return value.split(",")
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ValueError("expected an array of strings")
    if kind is Kind.FLOAT_LIST:
        if isinstance(value, str):
            return [parse_go_float(part.strip()) for part in value.split(",")]
        if isinstance(value, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            return [float(v) for v in value]
        raise ValueError("expected an array of numbers")
    raise AssertionError(f"unhandled kind {kind}")


# --------------------------------------------------------------------------- usage


def _unquote_usage(spec: FlagSpec) -> tuple[str, str]:
    # flag.UnquoteUsage: a `quoted` word in the help names the value.
    start = spec.help.find("`")
    if start >= 0:
        end = spec.help.find("`", start + 1)
        if end >= 0:
            name = spec.help[start + 1 : end]
            return name, spec.help[:start] + name + spec.help[end + 1 :]
    if not spec.takes_value:
        return "", spec.help
    placeholder = {
        Kind.STRING: "string",
        Kind.INT: "int",
        Kind.FLOAT: "float",
        Kind.DURATION: "duration",
    }.get(spec.kind, "value")
    return placeholder, spec.help


def _default_text(spec: FlagSpec, value: Any) -> str | None:
    """``(default ...)`` text, or None where Go treats the default as the zero value."""
    if spec.show is not None:
        text = spec.show(value)
        return None if text in ("", "0", "false") else text
    kind = spec.kind
    if kind is Kind.STRING:
        return go_quote(value) if value else None
    if kind is Kind.INT:
        return str(value) if value else None
    if kind is Kind.FLOAT:
        return go_format_float(value) if value else None
    if kind is Kind.BOOL:
        return "true" if value else None
    if kind is Kind.DURATION:
        return format_duration(value) if value else None
    if kind is Kind.STRING_LIST:
        return ",".join(value) or None
    if kind is Kind.FLOAT_LIST:
        return ",".join(go_format_float(v) for v in value) or None
    return str(value)


def usage(
    cls: type[DataclassInstance], prog: str, *, config_flag: bool = True, version_flag: bool = True
) -> str:
    """Usage text in the layout of Go's ``flag.PrintDefaults``, flags sorted by name."""
    defaults = _defaults(cls)
    specs = flag_specs(cls) + _builtin_specs(config_flag, version_flag)
    lines = [f"Usage of {prog}:"]
    for spec in sorted(specs, key=lambda s: s.name):
        placeholder, help_text = _unquote_usage(spec)
        head = f"  -{spec.name}" + (f" {placeholder}" if placeholder else "")
        text = help_text.replace("\n", "\n    \t")
        shown = _default_text(spec, defaults.get(spec.attr)) if spec.attr in defaults else None
        if shown is not None:
            text += f" (default {shown})"
        sep = "\t" if len(head) <= 4 else "\n    \t"
        lines.append(f"{head}{sep}{text}")
    return "\n".join(lines) + "\n"


def _defaults(cls: type[DataclassInstance]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for fld in dataclasses.fields(cls):
        if fld.default is not dataclasses.MISSING:
            values[fld.name] = fld.default
        elif fld.default_factory is not dataclasses.MISSING:
            values[fld.name] = fld.default_factory()
    return values


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParseResult(Generic[D]):
    """Outcome of :func:`parse_args`."""

    options: D
    version: bool
    """``--version`` was given: print :func:`version_string` and exit 0."""
    config_file: str
    """The ``--config`` path, or ``""``."""
    args: list[str]
    """Arguments left after flag parsing stopped (Go ignores them)."""
    sources: Mapping[str, Source]
    """Attribute name → where its value came from."""

    def is_explicit(self, attr: str) -> bool:
        """Whether ``attr`` was given on the command line."""
        return self.sources.get(attr) is Source.FLAG


def _parse_command_line(
    specs: Mapping[str, FlagSpec], argv: Sequence[str], usage_text: Callable[[], str]
) -> tuple[dict[str, Any], list[str]]:
    """Go's ``FlagSet.Parse``: the values set per attribute, and the leftover arguments."""
    values: dict[str, Any] = {}
    args = list(argv)

    def fail(message: str) -> NoReturn:
        raise FlagError(message, usage_text())

    while args:
        arg = args[0]
        if len(arg) < 2 or arg[0] != "-":
            break
        minuses = 1
        if arg[1] == "-":
            minuses = 2
            if len(arg) == 2:  # "--" terminates the flags
                args.pop(0)
                break
        name = arg[minuses:]
        if not name or name[0] in "-=":
            fail(f"bad flag syntax: {arg}")
        args.pop(0)
        has_value = False
        value = ""
        eq = name.find("=", 1)
        if eq > 0:
            name, value, has_value = name[:eq], name[eq + 1 :], True
        spec = specs.get(name)
        if spec is None:
            if name in ("help", "h"):
                raise HelpRequested(usage_text())
            fail(f"flag provided but not defined: -{name}")

        if not spec.takes_value:
            text = value if has_value else "true"
            try:
                parsed = _parse_scalar(spec, text)
            except ValueError as exc:
                if has_value:
                    fail(f"invalid boolean value {go_quote(text)} for -{name}: {exc}")
                fail(f"invalid boolean flag {name}: {exc}")
            values[spec.attr] = parsed
            continue

        if not has_value and args:
            value, has_value = args.pop(0), True
        if not has_value:
            fail(f"flag needs an argument: -{name}")
        try:
            if spec.kind is Kind.STRING_LIST:
                values.setdefault(spec.attr, []).append(value)
            elif spec.kind is Kind.FLOAT_LIST:
                # app.FloatArray.Set: comma separated, no trimming, appended.
                parsed_list = [parse_go_float(part) for part in value.split(",")]
                values.setdefault(spec.attr, []).extend(parsed_list)
            else:
                values[spec.attr] = _parse_scalar(spec, value)
        except ValueError as exc:
            fail(f"invalid value {go_quote(value)} for flag -{name}: {exc}")
    return values, args


def load_config_file(path: str) -> dict[str, Any]:
    """Read a TOML config file; any failure is a :class:`ConfigError` naming the file."""
    import tomllib  # loaded when first used: most servers start without a config file

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise ConfigError(f"failed to load config file {path} - open {path}: {reason}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"failed to load config file {path} - {exc}") from exc


def parse_args(
    cls: type[D],
    argv: Sequence[str],
    *,
    prog: str,
    config_flag: bool = True,
    version_flag: bool = True,
) -> ParseResult[D]:
    """Parse ``argv`` (without the program name) into an instance of the options dataclass.

    Each field resolves as: flag given on the command line > key in the
    ``--config`` TOML file > dataclass default, like NSQ's go-options.  When
    ``--version`` is given the config file is not read (Go prints the version
    first).  Unknown config keys are ignored.

    Raises :class:`FlagError`, :class:`HelpRequested` or :class:`ConfigError`.
    """
    field_specs = flag_specs(cls)
    all_specs = field_specs + _builtin_specs(config_flag, version_flag)
    by_name = {spec.name: spec for spec in all_specs}
    given, rest = _parse_command_line(
        by_name,
        argv,
        lambda: usage(cls, prog, config_flag=config_flag, version_flag=version_flag),
    )
    version = bool(given.pop("version", False))
    config_file = str(given.pop("config", ""))

    config: dict[str, Any] = {}
    if config_file and not version:
        config = load_config_file(config_file)

    kwargs: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for spec in field_specs:
        if spec.attr in given:
            kwargs[spec.attr] = given[spec.attr]
            sources[spec.attr] = Source.FLAG
        elif spec.cfg is not None and spec.cfg in config:
            raw = config[spec.cfg]
            try:
                kwargs[spec.attr] = _coerce_config(spec, raw)
            except ValueError as exc:
                raise ConfigError(
                    f"config file {config_file}: invalid value {_toml_repr(raw)} "
                    f"for {spec.cfg}: {exc}"
                ) from exc
            sources[spec.attr] = Source.CONFIG
        else:
            sources[spec.attr] = Source.DEFAULT
    options = cls(**kwargs)
    return ParseResult(
        options=options, version=version, config_file=config_file, args=rest, sources=sources
    )


# --------------------------------------------------------------------------- /config lookup


@dataclass(frozen=True)
class OptionRef:
    """One option found by its config name: its declaration and current value."""

    spec: FlagSpec
    value: Any

    @property
    def go_value(self) -> Any:
        """The value as Go holds it, ready for ``json.dumps`` (durations are int nanoseconds)."""
        if self.spec.go_value is not None:
            return self.spec.go_value(self.value)
        if self.spec.kind is Kind.DURATION:
            return seconds_to_ns(self.value)
        if isinstance(self.value, enum.IntEnum):
            return int(self.value)
        if isinstance(self.value, list):
            return list(self.value)
        return self.value


def option_by_cfg_name(opts: DataclassInstance, name: str) -> OptionRef | None:
    """Go's ``getOptByCfgName``: the option whose config key is ``name``, or None."""
    for spec in flag_specs(opts):
        if spec.cfg == name:
            return OptionRef(spec=spec, value=getattr(opts, spec.attr))
    return None
