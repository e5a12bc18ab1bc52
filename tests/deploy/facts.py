"""What the deploy files must agree with, read from the proxy itself, and the rendered manifests."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from proxy.api.access import ROUTE_INDEX
from proxy.app import build_app
from proxy.settings import Settings
from tests.deploy.kustomize import pod_spec, render

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = ("base", "overlays/redis", "overlays/classic-sidecar", "overlays/production")
NATIVE = ("base", "overlays/redis", "overlays/production")
PROXY = "cogproxy"  # the proxy container's name in the manifests


@cache
def serve_env_vars() -> frozenset[str]:
    """Every COGPROXY_* variable `cogproxy serve --help` documents."""
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=30,
    ).stdout
    found = frozenset(re.findall(r"COGPROXY_[A-Z_]+[A-Z]", out))
    assert {"COGPROXY_POLICY", "COGPROXY_PORT"} <= found, out
    return found


@cache
def routes() -> dict[str, frozenset[str]]:
    """Path -> HTTP methods of the proxy's application, as build_app registers them and the edge
    admits them (``proxy.api.routes``)."""
    app = build_app(Settings(policy_path=Path("unused.yaml"), module_dirs=()))
    return {resource.canonical: route.allowed for resource, route in app[ROUTE_INDEX].items()}


@cache
def _rendered(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(K8S / name))


def rendered(name: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_rendered(name)))


def one(resources: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [r for r in resources if r["kind"] == kind and name in (None, r["metadata"]["name"])]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


def deployment(name: str) -> dict[str, Any]:
    return one(rendered(name), "Deployment")


def proxy_container(spec: dict[str, Any]) -> dict[str, Any]:
    hits: list[dict[str, Any]] = [
        c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == PROXY
    ]
    assert len(hits) == 1, f"expected one {PROXY} container"
    return hits[0]


def env_values(container: dict[str, Any]) -> dict[str, str]:
    """Literal env values (valueFrom entries map to '')."""
    return {e["name"]: str(e.get("value", "")) for e in container.get("env", [])}


def pod(name: str) -> dict[str, Any]:
    spec = pod_spec(deployment(name))
    assert spec is not None
    return spec
