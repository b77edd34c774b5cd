"""The outputs README.md and docs/*.md quote are what the code prints (tests/quoted.py), and every
`loadax-mesh` command line the README shows runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from loadax_mesh.cli.main import main
from tests import quoted

ROOT = quoted.ROOT


def _blocks() -> list:
    found = []
    for path in quoted.documents():
        for block in quoted.blocks(path):
            marks = [pytest.mark.slow] if any(c.seconds for c in block.commands) else []
            if any(c.compiles for c in block.commands):
                marks.append(pytest.mark.compile)
            found.append(pytest.param(block, id=block.name, marks=marks))
    return found


def test_the_quoted_blocks_are_found():
    names = [p.id for p in _blocks()]
    assert any(n.startswith("README.md:") for n in names)
    assert any(n.startswith("docs/referees.md:") for n in names)
    assert len(names) >= 14


@pytest.mark.parametrize("block", _blocks())
def test_a_quoted_output_is_what_the_code_prints(block):
    want = quoted.render(block)
    assert list(block.body) == want, (
        f"{block.name} is stale: `python -m tests.quoted --update` rewrites it from the code"
    )


def test_select_keeps_the_parts_the_spec_names_and_marks_the_gaps():
    out = ["a", "b", "c", "note x", "d", "e"]
    assert quoted.select(out, "all") == out
    assert quoted.select(out, "1-2") == ["a", "b", "..."]
    assert quoted.select(out, "2 /note /") == ["...", "b", "...", "note x", "..."]
    assert quoted.select(out, "/note /-end") == ["...", "note x", "d", "e"]
    assert quoted.select(out, "1 /c/+1 6") == ["a", "...", "c", "note x", "...", "e"]
    with pytest.raises(ValueError, match="no line after"):
        quoted.select(out, "/zzz/")


# -- the README's command lines ---------------------------------------------------------------


def _readme_commands() -> list:
    """Each `loadax-mesh ...` (or `./dev <command> ...`) line of the README's bash blocks, but
    those a quoted block runs already (a compile's minutes once: its quote holds its output,
    an error line where it fails)."""
    lines, inside, found = (ROOT / "README.md").read_text().split("\n"), False, []
    quoted_argv = [c.argv for path in quoted.documents() for b in quoted.blocks(path)
                   for c in b.commands]  # fmt: skip
    for line in lines:
        if line.startswith("```"):
            inside = line == "```bash"
            continue
        words = shlex.split(line, comments=True) if inside else []
        if words[:1] == ["./dev"] and words[1:2] not in (["test"], ["lint"], ["docs"], ["bench"]):
            words = ["loadax-mesh", *words[1:]]
        if words[:1] == ["loadax-mesh"] and words[1:] not in quoted_argv:
            marks = {
                "compile": [pytest.mark.slow, pytest.mark.compile],
                "launch": [pytest.mark.slow, pytest.mark.multiprocess],
            }.get(words[1], [pytest.mark.slow] if quoted.slow_argv(words[1:]) else [])
            found.append(pytest.param(words[1:], id=" ".join(words[1:4]), marks=marks))
    return found


def test_the_readme_shows_the_commands():
    commands = [p.values[0][0] for p in _readme_commands()]
    for name in ("plan", "estimate", "hardware", "launch"):  # compile, replan: quoted blocks
        assert name in commands


@pytest.mark.parametrize("argv", _readme_commands())
def test_a_readme_command_line_runs(argv, tmp_path, monkeypatch, capsys):
    """Run where its files would land in a scratch folder; the repository's own files (an
    example, a catalogue) by their path from the root."""
    argv = [str(ROOT / a) if (ROOT / a).is_file() else a for a in argv]
    monkeypatch.chdir(tmp_path)
    if argv[0] == "launch":  # its children run `python`: this interpreter, from the root
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        cmd = [sys.executable, "-m", "loadax_mesh", *argv]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return
    code = main(argv)
    assert code == 0, capsys.readouterr().err
