"""Shared fixtures: paths, a builder that writes real module directories to disk, the fake upstream,
and the proxy in front of it (``proxy``, ``proxy_with(policy)``)."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import pytest
import structlog
import yaml
from hypothesis import settings

from proxy.conformance import OFFICIAL_VECTORS
from proxy.module.loader import load_module
from proxy.module.model import Module
from tests.fake_upstream import FakeUpstream
from tests.fake_upstream import fake_upstream as fake_upstream
from tests.paths import MODULES as MODULES
from tests.paths import ROOT as ROOT
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, RunningProxy, running_proxy, upstream_policy
from tests.redis_relay import relay as relay
from tests.support.redis_db import redis_db as redis_db

VECTORS = OFFICIAL_VECTORS

SLOW_FILES = frozenset(
    {
        "test_docs.py",
        "api/test_admin_listener.py",
        "api/test_dropin.py",
        "api/test_failover_load.py",
        "api/test_feedback.py",
        "api/test_honest_outcomes.py",
        "api/test_identity.py",
        "api/test_limits.py",
        "api/test_managed_redis.py",
        "api/test_modules.py",
        "api/test_passthrough.py",
        "api/test_redis_cluster.py",
        "api/test_redis_cluster_acl.py",
        "api/test_redis_cluster_replicas.py",
        "api/test_redis_outbox.py",
        "api/test_reload.py",
        "api/test_routing.py",
        "api/test_server.py",
        "api/test_shared_state.py",
        "api/test_spool_restart.py",
        "api/test_stream_recovery.py",
        "api/test_stream_relay.py",
        "api/test_streaming.py",
        "clients/test_matrix.py",
        "context/test_protocol.py",
        "context/test_quota.py",
        "context/test_redis.py",
        "deploy/test_dockerfile.py",
        "deploy/test_k8s.py",
        "fuzz/test_openapi.py",
        "media/test_module_media.py",
        "observability/test_logbuffer.py",
        "observability/test_logs.py",
        "observability/test_metrics.py",
        "observability/test_phoenix.py",
        "security/test_admin_port.py",
        "security/test_attack_26.py",
        "security/test_attack_30.py",
        "security/test_body_budget.py",
        "security/test_browser_guard.py",
        "security/test_context.py",
        "security/test_contract.py",
        "security/test_contract_honesty.py",
        "security/test_feedback.py",
        "security/test_harness.py",
        "security/test_hostile_upstream.py",
        "security/test_http_framing.py",
        "security/test_keys.py",
        "security/test_log_redaction_framing.py",
        "security/test_media_fetch.py",
        "security/test_media_inputs.py",
        "security/test_media_liveness.py",
        "security/test_models.py",
        "security/test_passthrough.py",
        "security/test_redaction.py",
        "security/test_slow_clients.py",
        "security/test_stream_sessions.py",
        "security/test_usage_admin.py",
        "state/test_outbox_cluster_down.py",
        "test_calibration_cli.py",
        "test_cli.py",
        "test_cli_imports.py",
        "test_cli_usage.py",
        "test_fake_upstream.py",
        "test_grafana.py",
        "test_grafana_calibration.py",
        "test_make_run.py",
        "test_proxy_server.py",
        "test_workers.py",
    }
)
"""Files whose tests spend seconds each on servers and subprocesses (measured with ``--durations=0``:
5 s or more per file, or a `cogproxy serve` subprocess per test). They carry the ``slow`` marker:
``make test-fast`` leaves them out for the edit-run loop, ``make test`` runs everything."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).parent
    for item in items:
        if item.path.relative_to(tests_dir).as_posix() in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


# `make mutation` runs with --hypothesis-profile=mutation: the same examples every run (a survivor
# must not depend on which examples hypothesis happened to draw) and no example database.
settings.register_profile("mutation", derandomize=True, database=None, deadline=None)
settings.register_profile("fast", max_examples=25)
"""`make test-fast`, the edit-run loop: fewer property examples; `make test` runs the default 100."""

META_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["confidence", "risk", "explain"],
    "properties": {
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "risk": {"type": "string", "enum": ["none", "low", "medium", "high"]},
        "explain": {"type": "string", "maxLength": 280},
    },
}

CHANGE_TYPE = {
    "oneOf": [
        {"type": "string", "enum": ["remove_redundancy", "simplify_logic", "other"]},
        {
            "type": "object",
            "required": ["custom", "reason"],
            "properties": {
                "custom": {"type": "string", "minLength": 1, "maxLength": 32},
                "reason": {"type": "string"},
            },
        },
    ]
}

SCHEMA: dict[str, Any] = {
    "meta": META_SCHEMA,
    "input": {
        "type": "object",
        "required": ["code"],
        "properties": {"code": {"type": "string"}, "language": {"type": "string"}},
    },
    "data": {
        "type": "object",
        "required": ["result", "rationale"],
        "properties": {
            "result": {"type": "string"},
            "changes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "risk"],
                    "properties": {
                        "type": CHANGE_TYPE,
                        "risk": {"type": "string", "enum": ["none", "low", "medium", "high"]},
                        "scope": {"type": "string", "enum": ["local", "function", "file"]},
                    },
                },
            },
            "note": {"type": "string"},
            "rationale": {"type": "string"},
            "extensions": {"$ref": "#/$defs/extensions"},
        },
    },
    "error": {
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
    },
    "$defs": {
        "extensions": {
            "type": "object",
            "properties": {
                "insights": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["text"],
                        "properties": {"text": {"type": "string"}, "suggested_mapping": {"type": "string"}},
                    },
                }
            },
        }
    },
}

PROMPT = """# Test module
Simplify $ARGUMENTS.
## Response Format (Envelope v2.2)
Return meta (confidence, risk, explain) and data (result, rationale).
"""


def write_module(
    root: Path,
    name: str = "demo",
    *,
    manifest: dict[str, Any] | None = None,
    schema: dict[str, Any] | None = None,
    prompt: str = PROMPT,
) -> Path:
    """Write a v2.2 module directory; ``manifest`` keys override the defaults (None removes)."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "name": name,
        "version": "1.0.0",
        "responsibility": "A module for tests",
        "tier": "decision",
        "excludes": ["writing files"],
    }
    for key, value in (manifest or {}).items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    (path / "module.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    (path / "prompt.md").write_text(prompt, encoding="utf-8")
    (path / "schema.json").write_text(json.dumps(schema if schema is not None else SCHEMA), encoding="utf-8")
    return path


ModuleFactory = Callable[..., Module]


@pytest.fixture(autouse=True)
def structlog_defaults_after_the_test() -> Iterator[None]:
    """A test that runs the CLI in-process configures logging with ``cache_logger_on_first_use``:
    left in place, the next module logger used afterwards is cached for the whole session, and
    ``structlog.testing.capture_logs`` in a later test captures nothing from it."""
    yield
    if structlog.is_configured():
        structlog.reset_defaults()


@pytest.fixture
def make_module(tmp_path: Path) -> ModuleFactory:
    """Build and load a module: ``make_module(tier="exec", schema=...)``."""
    counter = {"n": 0}

    def factory(*, schema: dict[str, Any] | None = None, prompt: str = PROMPT, **manifest: Any) -> Module:
        counter["n"] += 1
        path = write_module(tmp_path, f"mod{counter['n']}", manifest=manifest, schema=schema, prompt=prompt)
        return load_module(path)

    return factory


def success(**data: Any) -> dict[str, Any]:
    """A valid success envelope for the SCHEMA above; ``data`` keys override."""
    body = {"result": "x = 1", "rationale": "Folded constants."}
    body.update(data)
    return {"ok": True, "meta": {"confidence": 0.9, "risk": "low", "explain": "Folded."}, "data": body}


def schema_with(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SCHEMA)
    doc.update(changes)
    return doc


@pytest.fixture(scope="session")
def module_for_properties(tmp_path_factory: pytest.TempPathFactory) -> Module:
    """One module shared by hypothesis tests (function-scoped fixtures don't mix with @given)."""
    return load_module(write_module(tmp_path_factory.mktemp("prop")))


class ProxyWith(Protocol):
    def __call__(
        self, policy: dict[str, Any], *, modules: tuple[Path, ...] = ..., **settings: Any
    ) -> AbstractAsyncContextManager[RunningProxy]: ...


@pytest.fixture
def proxy_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProxyWith:
    """``async with proxy_with(policy, **settings) as px``: the proxy serving ``policy`` (written to
    ``tmp_path/policy.yaml``) in this process, with the fake upstream's key in its environment."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)

    def start(
        policy: dict[str, Any], *, modules: tuple[Path, ...] = (MODULES,), **settings: Any
    ) -> AbstractAsyncContextManager[RunningProxy]:
        return running_proxy(tmp_path, policy, modules=modules, **settings)

    return start


@pytest.fixture
def policy(fake_upstream: FakeUpstream) -> dict[str, Any]:
    """The policy ``proxy`` serves; a test module overrides this fixture to serve its own."""
    return upstream_policy(fake_upstream)


@pytest.fixture
async def proxy(proxy_with: ProxyWith, policy: dict[str, Any]) -> AsyncIterator[RunningProxy]:
    """The proxy in front of the fake upstream, serving the ``policy`` fixture."""
    async with proxy_with(policy) as running:
        yield running
