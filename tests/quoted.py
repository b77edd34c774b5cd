"""Command outputs quoted in README.md and docs/*.md, produced by the code.

A fenced block whose line before is a marker comment

    <!-- quoted: SPEC; SPEC ... -->

holds `$ loadax-mesh ...` command lines (a line ending in `\\` goes on), each followed by what
the command prints (stdout; and stderr where it exits non-zero) as its SPEC selects:

    all           every line (the default for a command without a SPEC)
    1-19 /mesh/   output lines 1 to 19 (1-based; `end` is the last), then from the first line
                  at or after them containing `mesh` ... a `...` line stands for every line
                  left out (before, between and after the parts)
    /GPU /-end    from the first line containing `GPU ` to the last (`/text/+2`: that line
                  and the two after it)
    3-8 vary:time the lines starting with `time` are quoted as written, not compared
                  (a compile's wall time)

`python -m tests.quoted` says which blocks differ from what the code prints now;
`python -m tests.quoted --update` rewrites them. tests/test_quoted.py checks every block.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- quoted:(.*)-->\s*$")
GAP = "..."
ITEM = r"/[^/]*/(?:-end|\+\d+)?|\S+"


@dataclass(frozen=True)
class Command:
    lines: tuple[str, ...]  # as written, `$ ` and continuations included
    spec: str

    @property
    def argv(self) -> list[str]:
        text = " ".join(line.rstrip("\\").strip() for line in self.lines)
        words = shlex.split(text.removeprefix("$").strip())
        if words[:1] != ["loadax-mesh"]:
            raise ValueError(f"{text!r}: a quoted command runs loadax-mesh")
        return words[1:]

    @property
    def compiles(self) -> bool:
        return self.argv[:1] == ["compile"]

    @property
    def seconds(self) -> bool:
        """A compile, or a choice for a model with experts (an expert axis and both MoE paths
        searched): a run of seconds, for the slow lane."""
        return self.compiles or slow_argv(self.argv)


def slow_argv(argv: list[str]) -> bool:
    if argv[:1] == ["compile"]:
        return True
    if "auto" not in argv or "--model" not in argv:
        return False
    from loadax_mesh.workload import ModelSpec

    return ModelSpec.from_name(argv[argv.index("--model") + 1]).num_experts > 0


@dataclass(frozen=True)
class Block:
    path: Path
    start: int  # index of the first line inside the fence
    stop: int  # index of the closing fence
    commands: tuple[Command, ...]
    body: tuple[str, ...]  # the block's lines as the file has them

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.start}"


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found = []
    for i, line in enumerate(lines):
        marker = MARKER.match(line)
        if marker is None:
            continue
        if not lines[i + 1].startswith("```"):
            raise ValueError(f"{path}:{i + 1}: a quoted marker must precede a fenced block")
        start = i + 2
        stop = next(j for j in range(start, len(lines)) if lines[j].startswith("```"))
        body = lines[start:stop]
        specs = [s.strip() for s in marker.group(1).split(";")]
        commands, current = [], None
        for line in body:
            if line.startswith("$ "):
                current = [line]
                commands.append(current)
            elif current is not None and current[-1].endswith("\\"):
                current.append(line)
        if not commands or len(specs) > len(commands):
            raise ValueError(f"{path}:{i + 1}: {len(specs)} specs for {len(commands)} commands")
        specs += ["all"] * (len(commands) - len(specs))
        found.append(
            Block(
                path,
                start,
                stop,
                tuple(Command(tuple(c), s or "all") for c, s in zip(commands, specs, strict=True)),
                tuple(body),
            )
        )
    return found


def run(command: Command) -> list[str]:
    """What the command prints, line by line (trailing spaces dropped): stdout, and where it
    fails, its error line after (a compile's progress line on stderr is no output)."""
    from loadax_mesh.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(command.argv)
    text = (out.getvalue() + (err.getvalue() if code else "")).rstrip("\n")
    return [line.rstrip() for line in text.split("\n")]


def select(output: list[str], spec: str) -> list[str]:
    """The lines of `output` the spec names, with `...` for each run left out."""
    items = [t for t in re.findall(ITEM, spec) if not t.startswith("vary:")]
    if items in ([], ["all"]):
        return list(output)
    shown: list[str] = []
    at = 0  # the first line not yet passed
    for item in items:
        if item.startswith("/"):
            text, _, more = item[1:].partition("/")
            first = next((j for j in range(at, len(output)) if text in output[j]), None)
            if first is None:
                raise ValueError(f"spec {spec!r}: no line after line {at} contains {text!r}")
            lo = first
            hi = len(output) - 1 if more == "-end" else first + int(more or 0)
        else:
            a, _, b = item.partition("-")
            lo = int(a) - 1
            hi = (len(output) if b == "end" else int(b or a)) - 1
            hi = min(hi, len(output) - 1)
            if lo < at or lo > hi:
                raise ValueError(f"spec {spec!r}: {item} is out of order or past the output")
        if lo > at:
            shown.append(GAP)
        shown.extend(output[lo : hi + 1])
        at = hi + 1
    if at < len(output):
        shown.append(GAP)
    return shown


def render(block: Block) -> list[str]:
    """The block's body as the code prints it now."""
    body: list[str] = []
    for command in block.commands:
        body.extend(command.lines)
        body.extend(select(run(command), command.spec))
    varying = {w[5:] for c in block.commands for w in c.spec.split() if w.startswith("vary:")}
    for word in varying:  # quoted as written: the same position in the old body
        for j, line in enumerate(body):
            if line.startswith(word + " ") and j < len(block.body):
                old = block.body[j]
                body[j] = old if old.startswith(word + " ") else line
    return body


def update(paths: list[Path], *, compiles: bool = True, write: bool = True) -> list[str]:
    """Rewrites (or, write=False, only finds) every stale block; the names of those found."""
    stale = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").split("\n")
        here = []
        for block in reversed(blocks(path)):  # from the end: earlier indices stay valid
            if not compiles and any(c.compiles for c in block.commands):
                continue
            body = render(block)
            if body != list(block.body):
                here.insert(0, block.name)
                lines[block.start : block.stop] = body
        if write and here:
            path.write_text("\n".join(lines), encoding="utf-8")
        stale += here
    return stale


def main(argv: list[str]) -> int:
    write = "--update" in argv
    compiles = "--no-compile" not in argv
    stale = update(documents(), compiles=compiles, write=write)
    for name in stale:
        print(f"{'rewrote' if write else 'stale'}  {name}")
    return 1 if stale and not write else 0


if __name__ == "__main__":
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main(sys.argv[1:]))
