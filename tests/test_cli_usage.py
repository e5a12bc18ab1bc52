"""The command line as a newcomer meets it: startup errors in one line, YAML errors with a
line and column, validated explain arguments, help for every argument."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import build_parser, main
from tests.conftest import MODULES, ROOT
from tests.support.unreadable import UNREADABLE_SHAPES

DEMO = str(ROOT / "policies" / "demo.yaml")


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--policy", DEMO, "--modules", str(MODULES), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
def test_a_port_in_use_is_one_line_and_exit_2(flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [flag, str(port)] if flag == "--port" else ["--port", "0", flag, str(port)]
        result = serve(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"cannot listen on 127.0.0.1:{port}: address already in use (is another cogproxy running?)"
    )


def test_an_address_that_cannot_be_bound_is_one_line() -> None:
    result = serve("--host", "192.0.2.1", "--port", "0")  # TEST-NET-1: never a local address
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("cannot listen on 192.0.2.1:")


def test_yaml_errors_name_the_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nproviders: [\n")
    assert main(["policy", "check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{bad}: line 3, column 1: invalid YAML: ") and "<unicode string>" not in out
    module = tmp_path / "m"
    module.mkdir()
    (module / "module.yaml").write_text("name: m\n  bad: [\n")
    assert main(["validate", str(module)]) == 1
    assert f"{module / 'module.yaml'}: line 2, column 6: invalid YAML: " in capsys.readouterr().out


def test_an_empty_policy_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["policy", "check", str(empty)]) == 1
    assert f"{empty}: the file is empty" in capsys.readouterr().out
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n")
    assert main(["policy", "check", str(listed)]) == 1
    assert "must be a YAML mapping" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan", "high"])
def test_policy_explain_refuses_a_confidence_outside_0_1(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(
            ["policy", "explain", "--policy", DEMO, "--tier", "exec", "--confidence", value, "--risk", "low"]
        )
    assert exit_.value.code == 2
    assert "--confidence" in capsys.readouterr().err


def test_policy_explain_takes_a_rung_name(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "policy",
        "explain",
        "--policy",
        DEMO,
        "--tier",
        "exec",
        "--confidence",
        "0.95",
        "--risk",
        "medium",
    ]
    assert main([*args, "--rung", "strong"]) == 0
    by_name = capsys.readouterr().out
    assert main([*args, "--rung", "1"]) == 0
    assert capsys.readouterr().out == by_name and "reject" in by_name
    assert main([*args, "--rung", "turbo"]) == 2
    assert "no such rung (rungs: fast, strong" in capsys.readouterr().err


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _parsers(child)
    return found


def test_every_argument_has_a_one_line_help_and_no_rest_markup() -> None:
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{parser.prog} {action.dest}: no help"
            assert "\n" not in action.help
        assert "``" not in parser.format_help(), parser.prog


def test_top_level_help_lists_every_command_and_an_example() -> None:
    text = build_parser().format_help()
    for command in ("serve", "policy", "new", "validate", "conformance", "test", "run"):
        assert f"\n    {command}" in text
    assert "examples:" in text and "cogproxy new" in text


def _policy_check(path: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "proxy", "policy", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("shape", UNREADABLE_SHAPES)
def test_policy_check_names_an_unreadable_file_without_a_traceback(shape: str, tmp_path: Path) -> None:
    make, reason = UNREADABLE_SHAPES[shape]
    path = tmp_path / "policy.yaml"
    make(path)
    result = _policy_check(path)
    assert (result.returncode, result.stdout, result.stderr) == (1, f"{path}: {reason}\n", "")


def test_policy_check_names_a_file_it_may_not_read(tmp_path: Path) -> None:
    """Mode 000. Root reads anything (CAP_DAC_OVERRIDE), so as root the check runs without it."""
    path = tmp_path / "policy.yaml"
    path.write_text((ROOT / "policies" / "default.yaml").read_text())
    path.chmod(0)
    without_override = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")
    result = _policy_check(path, *(without_override if os.geteuid() == 0 else ()))
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        f"{path}: cannot read: Permission denied\n",
        "",
    )


def test_serve_names_an_unreadable_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"version: 1\n\xff\n")
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--policy", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == f"serve: {path}: not UTF-8 text: byte 0xff at offset 11\n"
