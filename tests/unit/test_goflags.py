"""Go flag / go-options semantics of nsqpy.common.goflags."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from nsqpy.common.goflags import (
    ConfigError,
    FlagError,
    HelpRequested,
    Kind,
    LogLevel,
    Source,
    exit_on_error,
    flag,
    flag_specs,
    format_duration,
    format_duration_ns,
    go_format_float,
    option_by_cfg_name,
    parse_args,
    parse_duration,
    parse_duration_ns,
    parse_go_bool,
    parse_go_float,
    parse_go_int,
    usage,
    version_string,
)

NS = 1
US = 1000 * NS
MS = 1000 * US
S = 1000 * MS
M = 60 * S
H = 60 * M


@dataclass
class Sample:
    """A small options struct exercising every kind."""

    name: str = flag("name", "dflt", kind=Kind.STRING, help="a `word` to use")
    count: int = flag("count", 10, kind=Kind.INT, help="how many")
    ratio: float = flag("ratio", 0.5, kind=Kind.FLOAT, help="a ratio")
    on: bool = flag("on", True, kind=Kind.BOOL, help="switch, default on")
    off: bool = flag("off", False, kind=Kind.BOOL, help="switch, default off")
    timeout: float = flag("timeout", 60.0, kind=Kind.DURATION, help="a duration")
    addrs: list[str] = flag(
        "addr", default_factory=list, kind=Kind.STRING_LIST, cfg="addresses", help="repeatable"
    )
    quantiles: list[float] = flag(
        "quantile", default_factory=list, kind=Kind.FLOAT_LIST, help="repeatable, comma list"
    )
    level: LogLevel = flag(
        "log-level", LogLevel.INFO, kind=Kind.VALUE, parse=LogLevel.parse, help="log level"
    )
    legacy: bool = flag("legacy", False, kind=Kind.BOOL, cfg="", help="no config key")
    internal: float = 0.1


def parse(*argv: str) -> Sample:
    return parse_args(Sample, list(argv), prog="sample").options


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sample.cfg"
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------ declarations


def test_flag_specs_carry_names_cfg_keys_and_attrs() -> None:
    specs = {s.attr: s for s in flag_specs(Sample)}
    assert set(specs) == {
        "name",
        "count",
        "ratio",
        "on",
        "off",
        "timeout",
        "addrs",
        "quantiles",
        "level",
        "legacy",
    }
    assert specs["timeout"].name == "timeout"
    assert specs["timeout"].cfg == "timeout"
    assert specs["level"].cfg == "log_level"  # '-' becomes '_'
    assert specs["addrs"].cfg == "addresses"  # explicit override
    assert specs["legacy"].cfg is None  # cfg="" means no config key
    assert not specs["on"].takes_value
    assert specs["count"].takes_value


def test_value_kind_needs_a_parse_function() -> None:
    with pytest.raises(TypeError):
        flag("x", "", kind=Kind.VALUE, help="")


def test_defaults_when_nothing_given() -> None:
    result = parse_args(Sample, [], prog="sample")
    assert result.options == Sample()
    assert result.options.timeout == 60.0
    assert result.version is False
    assert result.config_file == ""
    assert result.args == []
    assert all(src is Source.DEFAULT for src in result.sources.values())


# ------------------------------------------------------------------ syntax forms


@pytest.mark.parametrize(
    "argv",
    [
        ["-count=5"],
        ["--count=5"],
        ["-count", "5"],
        ["--count", "5"],
    ],
)
def test_all_flag_syntax_forms(argv: list[str]) -> None:
    result = parse_args(Sample, argv, prog="sample")
    assert result.options.count == 5
    assert result.is_explicit("count")
    assert not result.is_explicit("name")


def test_value_may_start_with_a_dash() -> None:
    assert parse("--timeout", "-2s").timeout == -2.0
    assert parse("--name", "--weird").name == "--weird"


def test_empty_value_after_equals() -> None:
    assert parse("--name=").name == ""


def test_value_may_contain_equals() -> None:
    assert parse("--name=a=b").name == "a=b"


def test_last_scalar_wins() -> None:
    assert parse("--count=1", "--count=2").count == 2


def test_double_dash_ends_flags() -> None:
    result = parse_args(Sample, ["--count=3", "--", "--name=x"], prog="sample")
    assert result.options.count == 3
    assert result.options.name == "dflt"
    assert result.args == ["--name=x"]


def test_first_non_flag_stops_parsing() -> None:
    result = parse_args(Sample, ["--count=3", "extra", "--name=x"], prog="sample")
    assert result.options.count == 3
    assert result.options.name == "dflt"
    assert result.args == ["extra", "--name=x"]


def test_single_dash_is_a_positional_argument() -> None:
    result = parse_args(Sample, ["-", "--count=3"], prog="sample")
    assert result.options.count == 10
    assert result.args == ["-", "--count=3"]


# ------------------------------------------------------------------ bools


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_bool_true_forms(text: str) -> None:
    assert parse(f"--off={text}").off is True
    assert parse_go_bool(text) is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_bool_false_forms(text: str) -> None:
    assert parse(f"--on={text}").on is False
    assert parse(f"-on={text}").on is False


def test_bare_bool_flag_means_true() -> None:
    assert parse("--off").off is True
    assert parse("-off").off is True


def test_bool_flag_does_not_consume_next_argument() -> None:
    result = parse_args(Sample, ["--on", "false", "--count=3"], prog="sample")
    assert result.options.on is True
    assert result.options.count == 10  # parsing stopped at "false", like Go
    assert result.args == ["false", "--count=3"]


@pytest.mark.parametrize("text", ["yes", "no", "tRUE", "", "2"])
def test_bad_bool_value(text: str) -> None:
    with pytest.raises(FlagError) as info:
        parse(f"--on={text}")
    assert str(info.value) == f'invalid boolean value "{text}" for -on: parse error'


# ------------------------------------------------------------------ errors


def test_unknown_flag() -> None:
    with pytest.raises(FlagError) as info:
        parse("--foo=1")
    assert str(info.value) == "flag provided but not defined: -foo"
    assert info.value.usage.startswith("Usage of sample:\n")
    with pytest.raises(FlagError, match=r"^flag provided but not defined: -bar$"):
        parse("-bar")


@pytest.mark.parametrize("arg", ["---count=1", "--=1", "-=x"])
def test_bad_flag_syntax(arg: str) -> None:
    with pytest.raises(FlagError) as info:
        parse(arg)
    assert str(info.value) == f"bad flag syntax: {arg}"


def test_missing_argument() -> None:
    with pytest.raises(FlagError) as info:
        parse("--count")
    assert str(info.value) == "flag needs an argument: -count"


def test_bad_duration_value() -> None:
    with pytest.raises(FlagError) as info:
        parse("--timeout=x")
    assert str(info.value) == 'invalid value "x" for flag -timeout: parse error'
    with pytest.raises(FlagError, match=r'^invalid value "1" for flag -timeout: parse error$'):
        parse("--timeout", "1")


def test_bad_int_values() -> None:
    with pytest.raises(FlagError) as info:
        parse("--count=abc")
    assert str(info.value) == 'invalid value "abc" for flag -count: parse error'
    with pytest.raises(FlagError) as info:
        parse("--count=9223372036854775808")
    assert str(info.value) == (
        'invalid value "9223372036854775808" for flag -count: value out of range'
    )


def test_bad_custom_value_carries_its_own_error() -> None:
    with pytest.raises(FlagError) as info:
        parse("--log-level=loud")
    assert str(info.value) == (
        "invalid value \"loud\" for flag -log-level: invalid log level 'loud' "
        "(debug, info, warn, error, fatal)"
    )


def test_error_message_quotes_like_go() -> None:
    with pytest.raises(FlagError) as info:
        parse('--count=a"b\n')
    assert str(info.value) == 'invalid value "a\\"b\\n" for flag -count: parse error'


@pytest.mark.parametrize("arg", ["-h", "--h", "-help", "--help", "--help=1"])
def test_help(arg: str) -> None:
    with pytest.raises(HelpRequested) as info:
        parse("--count=1", arg, "--unknown")
    assert info.value.usage.startswith("Usage of sample:\n")


# ------------------------------------------------------------------ lists


def test_string_list_flag_appends_and_keeps_commas() -> None:
    opts = parse("--addr=a:1", "--addr", "b:2", "-addr=c:3,d:4")
    assert opts.addrs == ["a:1", "b:2", "c:3,d:4"]


def test_float_list_accepts_repeats_and_comma_lists() -> None:
    opts = parse("--quantile=0.5", "--quantile", "1.0,0.99")
    assert opts.quantiles == [0.5, 1.0, 0.99]


def test_float_list_rejects_garbage() -> None:
    with pytest.raises(FlagError) as info:
        parse("--quantile=0.5,x")
    assert str(info.value) == 'invalid value "0.5,x" for flag -quantile: parse error'


def test_list_defaults_are_not_shared() -> None:
    a, b = Sample(), Sample()
    a.addrs.append("x")
    assert b.addrs == []


# ------------------------------------------------------------------ custom kinds


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("debug", LogLevel.DEBUG),
        ("INFO", LogLevel.INFO),
        ("Warn", LogLevel.WARN),
        ("error", LogLevel.ERROR),
        ("FATAL", LogLevel.FATAL),
    ],
)
def test_log_level_parse_is_case_insensitive(text: str, level: LogLevel) -> None:
    assert LogLevel.parse(text) is level
    assert parse(f"--log-level={text}").level is level


def test_log_level_values_and_labels() -> None:
    assert [int(v) for v in LogLevel] == [1, 2, 3, 4, 5]
    assert LogLevel.WARN.label == "WARNING"
    assert LogLevel.INFO.label == "INFO"
    with pytest.raises(ValueError, match="invalid log level 'warning'"):
        LogLevel.parse("warning")


# ------------------------------------------------------------------ config file


def test_precedence_flag_over_config_over_default(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        """
name = "from-config"
count = 7
timeout = "1m30s"
""",
    )
    result = parse_args(Sample, ["--config", cfg, "--name=from-flag"], prog="sample")
    opts = result.options
    assert opts.name == "from-flag"
    assert opts.count == 7
    assert opts.timeout == 90.0
    assert opts.ratio == 0.5
    assert result.config_file == cfg
    assert result.sources["name"] is Source.FLAG
    assert result.sources["count"] is Source.CONFIG
    assert result.sources["ratio"] is Source.DEFAULT


def test_flag_equal_to_default_still_beats_config(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "count = 7\n")
    assert parse(f"--config={cfg}", "--count=10").count == 10


def test_config_flag_position_does_not_matter(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "count = 7\nname = 'c'\n")
    opts = parse("--name=f", f"-config={cfg}")
    assert (opts.name, opts.count) == ("f", 7)


def test_config_lists_from_arrays_and_strings(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        """
addresses = ["a:1", "b:2"]
quantile = [1, 0.99, 0.5]
""",
    )
    opts = parse(f"--config={cfg}")
    assert opts.addrs == ["a:1", "b:2"]
    assert opts.quantiles == [1.0, 0.99, 0.5]
    cfg = write_config(tmp_path, 'addresses = "a:1,b:2"\nquantile = "0.5, 0.25"\n')
    opts = parse(f"--config={cfg}")
    assert opts.addrs == ["a:1", "b:2"]
    assert opts.quantiles == [0.5, 0.25]


def test_command_line_list_replaces_config_list(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 'addresses = ["a:1", "b:2"]\n')
    assert parse(f"--config={cfg}", "--addr=c:3").addrs == ["c:3"]


def test_config_coercions_follow_go_options(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        """
count = "12"
ratio = 2
on = "false"
off = true
timeout = 1500
log_level = "debug"
""",
    )
    opts = parse(f"--config={cfg}")
    assert opts.count == 12
    assert opts.ratio == 2.0
    assert opts.on is False
    assert opts.off is True
    assert opts.timeout == 1.5  # integers are milliseconds
    assert opts.level is LogLevel.DEBUG


def test_config_ignores_unknown_keys_tables_and_flag_only_options(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        """
mystery = 1
legacy = true
[table]
count = 99
""",
    )
    opts = parse(f"--config={cfg}")
    assert opts.count == 10
    assert opts.legacy is False


def test_config_uses_cfg_key_not_flag_name(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 'addr = ["ignored"]\n')
    assert parse(f"--config={cfg}").addrs == []


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("count = 1.5", "count"),
        ('count = "abc"', "count"),
        ("count = true", "count"),
        ("name = 5", "name"),
        ("on = 1", "on"),
        ('on = "yes"', "on"),
        ("timeout = 1.5", "timeout"),
        ('timeout = "5"', "timeout"),
        ("addresses = [1, 2]", "addresses"),
        ('quantile = ["x"]', "quantile"),
        ('log_level = "loud"', "log_level"),
        ("ratio = true", "ratio"),
    ],
)
def test_config_wrong_types_are_errors(tmp_path: Path, line: str, key: str) -> None:
    cfg = write_config(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as info:
        parse(f"--config={cfg}")
    assert str(info.value).startswith(f"config file {cfg}: invalid value ")
    assert f" for {key}: " in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.cfg")
    with pytest.raises(ConfigError) as info:
        parse(f"--config={missing}")
    assert str(info.value) == (
        f"failed to load config file {missing} - open {missing}: no such file or directory"
    )


def test_bad_toml(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "count = = 3\n")
    with pytest.raises(ConfigError, match=r"^failed to load config file .* - "):
        parse(f"--config={cfg}")


def test_version_skips_config_loading(tmp_path: Path) -> None:
    result = parse_args(Sample, ["--version", f"--config={tmp_path / 'nope.cfg'}"], prog="sample")
    assert result.version is True


def test_version_false_is_not_a_request() -> None:
    assert parse_args(Sample, ["--version=false"], prog="sample").version is False


def test_builtin_flags_can_be_disabled() -> None:
    with pytest.raises(FlagError, match="flag provided but not defined: -config"):
        parse_args(Sample, ["--config=x"], prog="sample", config_flag=False)
    with pytest.raises(FlagError, match="flag provided but not defined: -version"):
        parse_args(Sample, ["--version"], prog="sample", version_flag=False)


# ------------------------------------------------------------------ version / exits


def test_version_string() -> None:
    line = version_string("nsqd")
    assert line == "nsqd v1.3.0 (built w/nsqpy-0.1.0)"
    assert re.fullmatch(r"nsqd v\d+\.\d+\.\d+ \(built w/[a-z0-9.\-]+\)", line)


def test_exit_on_flag_error_exits_1_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FlagError) as info:
        parse("--foo")
    with pytest.raises(SystemExit) as exited:
        exit_on_error(info.value)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("flag provided but not defined: -foo\nUsage of sample:\n")


def test_exit_on_config_error_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        exit_on_error(ConfigError("failed to load config file x - boom"))
    assert exited.value.code == 1
    assert capsys.readouterr().err == "failed to load config file x - boom\n"


def test_exit_on_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HelpRequested) as info:
        parse("--help")
    with pytest.raises(SystemExit) as exited:
        exit_on_error(info.value)
    assert exited.value.code == 0
    assert capsys.readouterr().err.startswith("Usage of sample:\n")


# ------------------------------------------------------------------ usage


def test_usage_layout_matches_go_print_defaults() -> None:
    text = usage(Sample, "sample")
    lines = text.splitlines()
    assert lines[0] == "Usage of sample:"
    names = [line.split()[0] for line in lines[1:] if line.startswith("  -")]
    assert names == sorted(names)
    assert '  -name word\n    \ta word to use (default "dflt")\n' in text
    assert "  -count int\n    \thow many (default 10)\n" in text
    assert "  -timeout duration\n    \ta duration (default 1m0s)\n" in text
    assert "  -on\n    \tswitch, default on (default true)\n" in text
    assert "  -off\n    \tswitch, default off\n" in text
    assert "  -addr value\n    \trepeatable\n" in text
    assert "  -ratio float\n    \ta ratio (default 0.5)\n" in text
    assert "  -config string\n" in text
    assert "  -version\n" in text


# ------------------------------------------------------------------ /config lookup


def test_option_by_cfg_name() -> None:
    opts = Sample(timeout=0.25, addrs=["a"], level=LogLevel.WARN)
    ref = option_by_cfg_name(opts, "timeout")
    assert ref is not None
    assert ref.spec.name == "timeout"
    assert ref.value == 0.25
    assert ref.go_value == 250_000_000  # Go's JSON for a time.Duration: nanoseconds
    addrs = option_by_cfg_name(opts, "addresses")
    assert addrs is not None and addrs.go_value == ["a"]
    level = option_by_cfg_name(opts, "log_level")
    assert level is not None and level.go_value == 3 and type(level.go_value) is int
    assert option_by_cfg_name(opts, "addr") is None  # flag name, not cfg key
    assert option_by_cfg_name(opts, "legacy") is None  # no config key
    assert option_by_cfg_name(opts, "internal") is None  # not a flag


# ------------------------------------------------------------------ Go integers / floats


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("42", 42),
        ("-42", -42),
        ("+7", 7),
        ("0x1F", 31),
        ("0X1f", 31),
        ("0o17", 15),
        ("017", 15),
        ("0b101", 5),
        ("1_000", 1000),
        ("0x_ff", 255),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
    ],
)
def test_parse_go_int_base0(text: str, value: int) -> None:
    assert parse_go_int(text) == value


@pytest.mark.parametrize("text", ["", "-", "08", "1__0", "_1", "1_", "0x", "1.0", " 1", "abc"])
def test_parse_go_int_syntax_errors(text: str) -> None:
    with pytest.raises(ValueError, match=r"^parse error$"):
        parse_go_int(text)


def test_parse_go_int_base10_for_config_strings() -> None:
    assert parse_go_int("010", base=10) == 10
    with pytest.raises(ValueError):
        parse_go_int("0x10", base=10)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1.0), ("0.5", 0.5), (".5", 0.5), ("1e3", 1000.0), ("1_0.5", 10.5), ("0x1p-2", 0.25)],
)
def test_parse_go_float(text: str, value: float) -> None:
    assert parse_go_float(text) == value


@pytest.mark.parametrize("text", ["", " 1", "1 ", "1__0", "abc", "1e"])
def test_parse_go_float_errors(text: str) -> None:
    with pytest.raises(ValueError, match=r"^parse error$"):
        parse_go_float(text)


def test_parse_go_float_overflow() -> None:
    with pytest.raises(ValueError, match=r"^value out of range$"):
        parse_go_float("1e400")


@pytest.mark.parametrize(
    ("value", "text"),
    [(2.0, "2"), (1.5, "1.5"), (0.0, "0"), (-0.5, "-0.5"), (1e-05, "1e-05"), (100.0, "100")],
)
def test_go_format_float(value: float, text: str) -> None:
    assert go_format_float(value) == text


# ------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        # Go's time package test table (parseDurationTests).
        ("0", 0),
        ("5s", 5 * S),
        ("30s", 30 * S),
        ("1478s", 1478 * S),
        ("-5s", -5 * S),
        ("+5s", 5 * S),
        ("-0", 0),
        ("+0", 0),
        ("5.0s", 5 * S),
        ("5.6s", 5 * S + 600 * MS),
        ("5.s", 5 * S),
        (".5s", 500 * MS),
        ("1.0s", 1 * S),
        ("1.00s", 1 * S),
        ("1.004s", 1 * S + 4 * MS),
        ("1.0040s", 1 * S + 4 * MS),
        ("100.00100s", 100 * S + 1 * MS),
        ("10ns", 10 * NS),
        ("11us", 11 * US),
        ("12\u00b5s", 12 * US),
        ("12\u03bcs", 12 * US),
        ("13ms", 13 * MS),
        ("14s", 14 * S),
        ("15m", 15 * M),
        ("16h", 16 * H),
        ("3h30m", 3 * H + 30 * M),
        ("10.5s4m", 4 * M + 10 * S + 500 * MS),
        ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
        ("1h2m3s4ms5us6ns", 1 * H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS),
        ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
        ("52763797000ns", 52763797000 * NS),
        ("0.3333333333333333333h", 20 * M),
        ("9007199254740993ns", (1 << 53) + 1),
        ("9223372036854775807ns", (1 << 63) - 1),
        ("9223372036854775.807us", (1 << 63) - 1),
        ("9223372036s854ms775us807ns", (1 << 63) - 1),
        ("-9223372036854775808ns", -(1 << 63)),
        ("-9223372036854775.808us", -(1 << 63)),
        ("-9223372036s854ms775us808ns", -(1 << 63)),
        ("-2562047h47m16.854775808s", -(1 << 63)),
        ("0.100000000000000000000h", 6 * M),
        ("0.830103483285477580700h", 49 * M + 48 * S + 372539827 * NS),
        # brief examples
        ("250ms", 250 * MS),
        ("1m30s", 90 * S),
        ("1.5h", 90 * M),
        ("-2s", -2 * S),
    ],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns
    assert parse_duration(text) == ns / 1e9


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'time: invalid duration ""'),
        ("3", 'time: missing unit in duration "3"'),
        ("1", 'time: missing unit in duration "1"'),
        ("-", 'time: invalid duration "-"'),
        ("s", 'time: invalid duration "s"'),
        (".", 'time: invalid duration "."'),
        ("-.", 'time: invalid duration "-."'),
        (".s", 'time: invalid duration ".s"'),
        ("+.s", 'time: invalid duration "+.s"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        ("1.5x2s", 'time: unknown unit "x" in duration "1.5x2s"'),
        ("3000000h", 'time: invalid duration "3000000h"'),
        ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
        ("9223372036854775.808us", 'time: invalid duration "9223372036854775.808us"'),
        ("9223372036854ms775us808ns", 'time: invalid duration "9223372036854ms775us808ns"'),
        ("1\u00b5", 'time: unknown unit "\\xc2\\xb5" in duration "1\\xc2\\xb5"'),
        (" 1s", 'time: invalid duration " 1s"'),
    ],
)
def test_parse_duration_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration_ns(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        # Go's time package test table (durationTests).
        (0, "0s"),
        (1 * NS, "1ns"),
        (1100 * NS, "1.1\u00b5s"),
        (2200 * US, "2.2ms"),
        (3300 * MS, "3.3s"),
        (4 * M + 5 * S, "4m5s"),
        (4 * M + 5001 * MS, "4m5.001s"),
        (5 * H + 6 * M + 7001 * MS, "5h6m7.001s"),
        (8 * M + 1 * NS, "8m0.000000001s"),
        ((1 << 63) - 1, "2562047h47m16.854775807s"),
        (-(1 << 63), "-2562047h47m16.854775808s"),
        # brief examples
        (90 * S, "1m30s"),
        (250 * MS, "250ms"),
        (2 * H, "2h0m0s"),
        (-2 * S, "-2s"),
        (60 * S, "1m0s"),
        (1 * MS, "1ms"),
    ],
)
def test_format_duration_ns(ns: int, text: str) -> None:
    assert format_duration_ns(ns) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0s"), (0.25, "250ms"), (90.0, "1m30s"), (7200.0, "2h0m0s"), (0.1, "100ms")],
)
def test_format_duration_seconds(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "text",
    ["250ms", "1m30s", "2h0m0s", "1.5s", "15m0s", "25ms", "1h0m0s", "10m0s", "1.1\u00b5s", "7ns"],
)
def test_duration_round_trip(text: str) -> None:
    assert format_duration_ns(parse_duration_ns(text)) == text
    assert format_duration(parse_duration(text)) == text
