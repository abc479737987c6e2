"""The code blocks of the project's Markdown docs, and how each is to be run.

Pure text work (no processes): :func:`blocks` finds the fenced blocks of a file, with the
``<!-- doc-test: ... -->`` marker written right above one; :func:`console_steps` splits a
``console`` block into commands and the output each must print; :func:`output_matches`
compares an output with what the doc shows; :class:`Substitutions` turns what a user
types (NSQ's default ports, ``./scripts/run.sh``, cluster and storage placeholders) into
what the test runs against.

Languages: ``sh``/``bash``/``shell`` run in bash; ``console`` runs each ``$ `` line and
compares its output; ``python`` runs as a script, or with pytest when it defines tests;
``toml`` and ``json`` are parsed (a ``toml`` block of pytest options is tried by pytest);
``text`` is output or a diagram, shown, not run. A block without a language is refused:
whoever adds a block says what it is.

Markers (an HTML comment on the line above the fence):

* ``<!-- doc-test: skip: <why> -->``: not run; the reason is required;
* ``<!-- doc-test: background; expect: <text> -->``: runs beside the blocks after it (a
  server, a consumer: what runs until Ctrl-C); the test waits for ``<text>`` in its output,
  and Ctrl-C (SIGINT) stops it once the file's blocks have run;
* ``<!-- doc-test: venv -->``: runs with a fresh virtual environment first on PATH (``pip``
  and ``python`` there), for installation steps.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

SHELL = frozenset({"sh", "bash", "shell"})
RUN = SHELL | {"console", "python"}
CHECKED = frozenset({"toml", "json"})
SHOWN = frozenset({"text"})
LANGUAGES = RUN | CHECKED | SHOWN

FENCE = re.compile(r"^(\s*)(```+)(\S*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
WILDCARD = "..."
RUN_SH = re.compile(r"^\s*(\$ )?\./scripts/run\.sh\b", re.M)  # a command line starting the servers


class DocError(Exception):
    """A doc block the test cannot accept as written (no language, a marker without reason)."""


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str  # dedented to the fence's indentation
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUN and "skip" not in self.directives

    @property
    def starts_servers(self) -> bool:
        """Whether it runs ./scripts/run.sh (then the test does not start its own)."""
        return (
            self.runs and self.lang in SHELL | {"console"} and RUN_SH.search(self.text) is not None
        )

    @property
    def is_pytest(self) -> bool:
        return (
            self.lang == "python" and re.search(r"^(async )?def test_", self.text, re.M) is not None
        )


def parse_marker(text: str, where: str) -> dict[str, str]:
    """``skip: why`` / ``background; expect: text`` / ``venv`` into a dict of directives."""
    directives: dict[str, str] = {}
    if text.startswith("skip:"):  # the rest is the reason, semicolons and all
        text = "skip:" + text[5:].replace(";", ",")
    for part in (p.strip() for p in text.split(";")):
        name, _, value = part.partition(":")
        name, value = name.strip(), value.strip()
        if name not in ("skip", "background", "expect", "venv"):
            raise DocError(f"{where}: unknown doc-test directive {name!r}")
        directives[name] = value
    if "skip" in directives and not directives["skip"]:
        raise DocError(f"{where}: a doc-test skip must say why: <!-- doc-test: skip: <reason> -->")
    if "expect" in directives and "background" not in directives:
        raise DocError(f"{where}: expect: is for background blocks")
    return directives


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with its marker's directives."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if end == len(lines):
            raise DocError(f"{path.name}:{i + 1}: unclosed code block")
        where = f"{path.name}:{i + 1}"
        if lang not in LANGUAGES:
            raise DocError(
                f"{where}: code block language {lang!r}: use one of {sorted(LANGUAGES)}"
                " (text for output and diagrams)"
            )
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        ]
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        directives = parse_marker(marker.group(1), where) if marker else {}
        found.append(Block(path, i + 1, lang, "\n".join(body) + "\n", directives))
        i = end + 1
    return found


@dataclass
class Step:
    """One command of a console block and the output the doc shows for it."""

    command: str
    expected: str


def console_steps(text: str) -> list[Step]:
    """``$ cmd`` lines (continued by a trailing backslash) and the lines under each."""
    steps: list[Step] = []
    lines = text.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise DocError(f"console output before any command: {lines[i]!r}")
        command = [lines[i][2:]]
        while command[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            command.append(lines[i])
        i += 1
        out: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            out.append(lines[i])
            i += 1
        steps.append(Step("\n".join(command), "\n".join(out)))
    return steps


def _json_like(text: str) -> object:
    """Parse ``text`` as JSON where a bare ``...`` stands for any value."""
    return json.loads(re.sub(r'(?<!")\.\.\.(?!")', '"..."', text))


def _same(expected: object, actual: object) -> bool:
    """JSON equality where ``"..."`` is any value and ``[...]`` any list."""
    if expected == WILDCARD or (expected == [WILDCARD] and isinstance(actual, list)):
        return True
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(
            _same(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(map(_same, expected, actual))
    return expected == actual


def output_matches(expected: str, actual: str) -> bool:
    """Whether a command's output is what the doc shows: equal JSON when the doc shows
    JSON (``...`` matching any value), else equal text up to runs of white space, with
    ``...`` matching anything."""
    if expected.strip().startswith(("{", "[")):
        try:
            return _same(_json_like(expected), json.loads(actual))
        except ValueError:
            pass
    norm_expected = " ".join(expected.split())
    norm_actual = " ".join(actual.split())
    pattern = ".*?".join(re.escape(part) for part in norm_expected.split(WILDCARD))
    return re.fullmatch(pattern, norm_actual, re.S) is not None


@dataclass
class Substitutions:
    """What a block's text becomes before it runs: the docs keep NSQ's default ports and
    placeholders (that is what users type), the test runs on its own free ports and dirs."""

    ports: dict[int, int]  # doc port -> the test's
    replace: dict[str, str]  # literal placeholder -> its value here
    run_sh_args: list[str]  # given to every ./scripts/run.sh, before the doc's own flags
    tiny_args: dict[str, list[str]]  # bench script name -> flags appended to its command lines
    run_sh_count: int = 0  # "{n}" in run_sh_args: a data folder of its own for each run.sh

    def run_sh(self) -> str:
        """The flags of the next ./scripts/run.sh."""
        self.run_sh_count += 1
        return " ".join(arg.replace("{n}", str(self.run_sh_count)) for arg in self.run_sh_args)

    def apply(self, text: str) -> str:
        """Ports first (on the doc's own text only), then what the test adds."""
        text = _join_continuations(text)
        text = re.sub(
            r"(?<![\d.])(\d{4})(?!\d)",
            lambda m: str(self.ports.get(int(m.group(1)), m.group(1))),
            text,
        )
        text = RUN_SH.sub(lambda m: f"{m.group(0)} {self.run_sh()}", text)
        text = "\n".join(self._tiny(line) for line in text.split("\n"))
        for placeholder, value in self.replace.items():  # not inside a longer path
            pattern = rf"(?<![\w./~-]){re.escape(placeholder)}"
            text = re.sub(pattern, value.replace("\\", "\\\\"), text)
        return text

    def _tiny(self, line: str) -> str:
        """A bench script's line with its tiny-run flags appended before any comment
        (argparse keeps an option's last value, so they win over the doc's)."""
        for script, extra in self.tiny_args.items():
            if re.search(rf"\bbench/{re.escape(script)}\b", line):
                command, comment = _split_comment(line)
                return f"{command.rstrip()} {' '.join(extra)}{comment and '  ' + comment}"
        return line


def _join_continuations(text: str) -> str:
    return re.sub(r"\\\n\s*", "", text)


def _split_comment(line: str) -> tuple[str, str]:
    """``cmd  # note`` -> (``cmd``, ``# note``), a ``#`` inside quotes not counted."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i:]
    return line, ""
