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
from tests.support.tls_certs import make_certificates

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = (
    "base",
    "overlays/redis",
    "overlays/classic-sidecar",
    "overlays/production",
    "overlays/managed-redis",
)
NATIVE = ("base", "overlays/redis", "overlays/production", "overlays/managed-redis")
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


SECRET_FILES = {
    "COGPROXY_REDIS_CA_FILE": "ca",
    "COGPROXY_REDIS_CERT_FILE": "cert",
    "COGPROXY_REDIS_KEY_FILE": "key",
    "COGPROXY_REDIS_PASSWORD_FILE": "password",
}
"""The variables that name a file of a mounted Secret (TLS and ACL of overlays/managed-redis)."""
PASSWORD = "s3cret"
"""The password the stand-in Secret file holds."""


def with_secret_files(env: dict[str, str], root: Path) -> dict[str, str]:
    """``env`` with each Secret file it names made under ``root`` (a CA and client pair made with
    openssl, the password ``PASSWORD``) and its variable pointing there, as if mounted."""
    named = {var: Path(env[var]) for var in SECRET_FILES if var in env}
    if not named:
        return env
    certs = make_certificates(root / "made")
    content = {
        "ca": certs.ca.cert.read_bytes(),
        "cert": certs.client.cert.read_bytes(),
        "key": certs.client.key.read_bytes(),
        "password": f"{PASSWORD}\n".encode(),
    }
    laid = dict(env)
    for var, path in named.items():
        target = root / path.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content[SECRET_FILES[var]])
        laid[var] = str(target)
    return laid
