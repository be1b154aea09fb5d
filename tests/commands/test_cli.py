"""The command line: every subcommand is listed and explains itself."""

import subprocess
import sys

import pytest

from lowbit.cli import build_parser, main


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("formats", "bench"):
        assert cmd in out


def test_every_subcommand_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        assert p.description or p.format_help(), name


def test_formats_rejects_bad_sizes(capsys):
    assert main(["formats", "--samples", "0"]) == 2
    assert "positive" in capsys.readouterr().err


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "lowbit", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "formats" in out.stdout
