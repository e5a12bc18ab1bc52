"""The command line starts light: its help, and every command that serves nothing, never imports
the server, the app or aiohttp's web server (``serve`` imports them when it runs); the help imports
no HTTP or Redis client, no policy, no pipeline either."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from proxy.cli import build_parser
from tests.conftest import MODULES, ROOT

EXAMPLE_INPUT = MODULES / "code-analyzer" / "tests" / "clean_function.input.json"
SERVING = ("proxy.app", "proxy.server", "aiohttp.web")
HEAVY = (*SERVING, "aiohttp", "redis", "structlog", "proxy.policy", "proxy.pipeline")
COLUMNS = "100"
DRIVER = f"""
import json, sys
from proxy.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps([name for name in {HEAVY!r} if name in sys.modules]), file=sys.stderr)
sys.exit(code)
"""
"""``cogproxy ARGS`` as its entry point runs it, then which of ``HEAVY`` it loaded, on stderr."""


def cogproxy(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": COLUMNS},
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stderr.splitlines()[-1])
    return done, loaded


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["serve", "--help"],
        ["policy", "--help"],
        ["policy", "explain", "--help"],
        ["policy", "tune", "--help"],
        ["calibration", "report", "--help"],
        ["run", "--help"],
    ],
)
def test_help_loads_no_server_and_reads_as_in_a_process_that_has_it(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done, loaded = cogproxy(*args)
    assert loaded == []
    monkeypatch.setenv("COLUMNS", COLUMNS)
    with pytest.raises(SystemExit):
        build_parser().parse_args(args)
    assert done.stdout == capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["policy", "check", "policies/demo.yaml"],
        ["validate", "code-analyzer", "--modules", str(MODULES)],
        ["test", "code-analyzer", "--modules", str(MODULES)],
        ["run", "code-analyzer", "--modules", str(MODULES), "--input", str(EXAMPLE_INPUT)],
        ["conformance"],
    ],
)
def test_commands_that_serve_nothing_load_no_server(args: list[str]) -> None:
    _, loaded = cogproxy(*args)
    assert not set(loaded) & set(SERVING)
