"""Fuzz the proxy's own HTTP surface from its ``GET /openapi.json`` with schemathesis.

A real ``cogproxy serve`` (offline demo policy, bundled modules) answers every generated
request; each answer must not be a 5xx and must match the document (status, content type,
body schema). Bounded and derandomized: the same examples every run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from proxy.api.openapi import document
from proxy.api.routes import ROUTES
from proxy.module.registry import ModuleRegistry
from tests.conftest import MODULES, ROOT
from tests.proxy_server import PIPE_CLOSE_S, Drain, free_port
from tests.support.polling import wait_sync

MAX_EXAMPLES = 40
"""Per operation: ~10 operations keep the whole fuzz run well under a minute on 2 cores."""
READY_DEADLINE_S = 30.0
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _wait_ready(url: str, proc: subprocess.Popen[str], stderr: Drain) -> None:
    def serving() -> bool:
        with urllib.request.urlopen(url + "/readyz", timeout=1) as answer:
            return bool(answer.status == 200)

    def exited() -> str | None:
        if proc.poll() is None:
            return None
        stderr.join(PIPE_CLOSE_S)
        return f"serve exited {proc.returncode}: {stderr.text()}"

    wait_sync(
        serving,
        "the proxy ready (/readyz 200)",
        timeout=READY_DEADLINE_S,
        ignore=(urllib.error.URLError, ConnectionError),
        give_up=exited,
    )


@pytest.fixture(scope="module")
def served_url() -> Iterator[str]:
    """``cogproxy serve`` on the offline demo policy, for the whole module."""
    port = free_port()
    command = [
        sys.executable, "-m", "proxy", "serve", "--policy", str(ROOT / "policies" / "demo.yaml"),
        "--modules", str(MODULES), "--port", str(port), "--log-level", "warning", "--reload-interval", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    stderr = Drain(proc.stderr)  # read while it runs: a full pipe would stall the server
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, stderr)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        stderr.join(PIPE_CLOSE_S)
        assert "proxy.internal_error" not in stderr.text(), stderr.text()


# Built in-process from the same code the server runs (schemathesis' fixture-based lazy loader
# does not run under pytest 9); test_the_served_document_is_the_one_fuzzed checks they agree.
_REGISTRY = ModuleRegistry.load([MODULES])
DOCUMENT = document([_REGISTRY.modules[name] for name in _REGISTRY.names()], ROUTES)
schema = schemathesis.openapi.from_dict(DOCUMENT)


def test_the_served_document_is_the_one_fuzzed(served_url: str) -> None:
    with urllib.request.urlopen(served_url + "/openapi.json", timeout=5) as answer:
        assert json.load(answer) == DOCUMENT


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_the_proxy_answers_as_its_openapi_document_says(
    case: schemathesis.Case[Any], served_url: str
) -> None:
    case.call_and_validate(base_url=served_url, checks=CHECKS)
