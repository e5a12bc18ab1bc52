"""deploy/k8s: every kustomization renders, validates against the Kubernetes schemas, and agrees
with the proxy it deploys (settings, routes, policy validation, module loading)."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from proxy.api.routes import PROBE_ROUTES
from proxy.app import build_app
from proxy.cli import build_parser, resolve_serve_options, serve_settings
from proxy.module.registry import ModuleRegistry
from proxy.policy.loader import parse_policy
from proxy.settings import DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_RELOAD_INTERVAL_S, Settings
from tests.deploy.facts import (
    K8S,
    KUSTOMIZATIONS,
    NATIVE,
    PASSWORD,
    PROXY,
    ROOT,
    deployment,
    env_values,
    one,
    pod,
    proxy_container,
    rendered,
    routes,
    serve_env_vars,
    with_secret_files,
)
from tests.deploy.kustomize import KustomizeError, json_patch, strategic_merge
from tests.proxy_server import free_port

# Native sidecars (restartable init containers) are on by default from 1.29: validate against
# the oldest release these manifests support and the newest kubernetes-validate ships.
SCHEMA_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}  # not in the Kubernetes schemas: checked below
MONITORING_API = "monitoring.coreos.com/v1"
PODMONITOR = K8S / "base" / "podmonitor.yaml"
UID = 10001

every = pytest.mark.parametrize("name", KUSTOMIZATIONS)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def config_map(resources: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return one(resources, "ConfigMap", name)


def volumes(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in spec.get("volumes", [])}


def mount_source(spec: dict[str, Any], mount_path: str) -> dict[str, Any]:
    """The configMap volume source mounted at ``mount_path`` in the proxy container."""
    mounts = {m["mountPath"]: m for m in proxy_container(spec).get("volumeMounts", [])}
    assert mount_path in mounts, f"nothing is mounted at {mount_path} (mounts: {sorted(mounts)})"
    volume = volumes(spec)[mounts[mount_path]["name"]]
    assert "configMap" in volume, f"{mount_path}: expected a ConfigMap volume, got {volume}"
    source: dict[str, Any] = volume["configMap"]
    return source


def mount_like_kubelet(root: Path, cm: dict[str, Any], source: dict[str, Any]) -> Path:
    """Lay a ConfigMap volume out as the kubelet does: the files in a timestamped directory,
    a ``..data`` symlink to it, and one symlink per top-level entry through ``..data``."""
    items = source.get("items") or [{"key": k, "path": k} for k in cm["data"]]
    root.mkdir(parents=True, exist_ok=True)
    stamp = root / "..2026_11_25_00_00_00.000000001"
    for item in items:
        target = stamp / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(cm["data"][item["key"]], encoding="utf-8")
    (root / "..data").symlink_to(stamp.name)
    for top in sorted({Path(item["path"]).parts[0] for item in items}):
        (root / top).symlink_to(f"..data/{top}")
    return root


def pre_stop_seconds(container: dict[str, Any]) -> float:
    pre_stop = container["lifecycle"]["preStop"]
    if "sleep" in pre_stop:
        return float(pre_stop["sleep"]["seconds"])
    command = " ".join(pre_stop["exec"]["command"])
    match = re.search(r"time\.sleep\((\d+(?:\.\d+)?)\)|^(?:/bin/)?sleep (\d+(?:\.\d+)?)$", command)
    assert match, f"cannot read a sleep from the preStop command {command!r}"
    return float(match.group(1) or match.group(2))


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity.removesuffix(suffix)) * factor
    return float(quantity) / 2**20


# --- rendering and schemas ----------------------------------------------------------------


def test_every_kustomization_is_tested() -> None:
    found = {str(p.parent.relative_to(K8S)) for p in K8S.rglob("kustomization.yaml")}
    assert found == set(KUSTOMIZATIONS)


@every
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_manifests_validate_against_the_kubernetes_schemas(name: str, version: str) -> None:
    resources = rendered(name)
    keys = [(r["kind"], r["metadata"]["name"]) for r in resources]
    assert len(keys) == len(set(keys)), f"duplicate resources in {name}: {keys}"
    for resource in resources:
        if resource["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {resource['kind']}/{resource['metadata']['name']}: {where}: {exc.message}")


@every
def test_monitors_are_prometheus_operator_resources(name: str) -> None:
    resources = [*rendered(name), yaml.safe_load(PODMONITOR.read_text(encoding="utf-8"))]
    for monitor in (r for r in resources if r["kind"] in CRD_KINDS):
        assert monitor["apiVersion"] == MONITORING_API
        assert monitor["metadata"]["name"]
        endpoints = monitor["spec"][
            "endpoints" if monitor["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
        ]
        assert endpoints
        for endpoint in endpoints:
            assert endpoint["path"] == "/metrics"
            assert "GET" in routes()[endpoint["path"]]
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}


# --- the sidecar layout -------------------------------------------------------------------


@pytest.mark.parametrize("name", NATIVE)
def test_the_proxy_is_a_native_sidecar(name: str) -> None:
    spec = pod(name)
    init = {c["name"]: c for c in spec.get("initContainers", [])}
    assert init[PROXY]["restartPolicy"] == "Always"
    assert PROXY not in {c["name"] for c in spec["containers"]}
    assert "startupProbe" in init[PROXY], "the app must start only once the proxy is up"


def test_the_classic_sidecar_is_the_same_proxy_as_a_second_container() -> None:
    spec = pod("overlays/classic-sidecar")
    assert PROXY not in {c["name"] for c in spec.get("initContainers", [])}
    assert [c["name"] for c in spec["containers"]] == ["app", PROXY]
    classic = proxy_container(spec)
    assert "restartPolicy" not in classic
    native = dict(proxy_container(pod("base")))
    assert native.pop("restartPolicy") == "Always"
    assert classic == native


# --- agreement with the proxy's settings and routes ---------------------------------------


@every
def test_env_vars_are_real_serve_settings(name: str) -> None:
    spec = pod(name)
    for container in spec.get("initContainers", []) + spec["containers"]:
        named = {e["name"] for e in container.get("env", []) if e["name"].startswith("COGPROXY_")}
        unknown = named - serve_env_vars()
        assert not unknown, f"{name}: {container['name']} sets {sorted(unknown)}, unknown to `cogproxy serve`"
    env = env_values(proxy_container(spec))
    assert ipaddress.ip_address(env["COGPROXY_HOST"]).is_loopback
    assert env["COGPROXY_ADMIN_HOST"] == "0.0.0.0"


def admin_port(name: str) -> int:
    return int(env_values(proxy_container(pod(name)))["COGPROXY_ADMIN_PORT"])


@every
def test_ports_and_probes_match_the_proxy(name: str) -> None:
    proxy = proxy_container(pod(name))
    port = admin_port(name)
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert ports == {"admin": port}
    probes = {kind: proxy[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    for kind, probe in probes.items():
        assert "GET" in routes().get(probe["path"], set()), f"{kind}: {probe['path']} is not a route"
        served = {route.path for route in PROBE_ROUTES}
        assert probe["path"] in served, f"{kind}: {probe['path']} is not served on the probe listener"
        assert ports.get(probe["port"], probe["port"]) == port, f"{kind}: port {probe['port']}"


def port_numbers(resource: dict[str, Any], named: dict[str, int]) -> set[int]:
    """Every port number a resource mentions (names resolved through ``named``), at any depth."""
    found: set[int] = set()

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for item in node:
                walk(item, key)
        elif key in {"port", "containerPort", "targetPort", "hostPort"}:
            found.add(named[node] if isinstance(node, str) and node in named else int(node))

    walk(resource)
    return found


@every
def test_no_manifest_exposes_the_api_port_beyond_loopback(name: str) -> None:
    """The LLM API (provider keys injected) is for the app over localhost only: bound to
    loopback, and no container port, Service, probe, monitor or NetworkPolicy names it."""
    resources, spec = rendered(name), pod(name)
    env = env_values(proxy_container(spec))
    assert ipaddress.ip_address(env["COGPROXY_HOST"]).is_loopback, env["COGPROXY_HOST"]
    api, admin = int(env["COGPROXY_PORT"]), admin_port(name)
    assert api != admin
    named = {
        p["name"]: p["containerPort"]
        for c in spec.get("initContainers", []) + spec["containers"]
        for p in c.get("ports", [])
        if "name" in p
    }
    for resource in resources:
        if resource["kind"] == "ConfigMap":
            continue
        mentioned = port_numbers(resource, named)
        assert api not in mentioned, (
            f"{name}: {resource['kind']}/{resource['metadata']['name']} exposes {api}"
        )
    assert admin in port_numbers(one(resources, "Service"), named)


@every
def test_the_app_talks_to_its_sidecar(name: str) -> None:
    spec = pod(name)
    port = int(env_values(proxy_container(spec))["COGPROXY_PORT"])
    [app] = [c for c in spec["containers"] if c["name"] == "app"]
    env = env_values(app)
    assert env["OPENAI_BASE_URL"] == f"http://localhost:{port}/v1"
    assert "POST" in routes()["/v1/chat/completions"]
    assert env["OPENAI_API_KEY"], "the OpenAI SDK refuses to start without a key"


@every
def test_shutdown_fits_in_the_grace_period(name: str) -> None:
    spec = pod(name)
    proxy = proxy_container(spec)
    drain = float(env_values(proxy).get("COGPROXY_DRAIN_TIMEOUT") or DEFAULT_DRAIN_TIMEOUT_S)
    assert drain == DEFAULT_DRAIN_TIMEOUT_S
    grace = spec["terminationGracePeriodSeconds"]
    sleep = pre_stop_seconds(proxy)
    assert sleep > 0
    assert drain < grace - sleep, (
        f"preStop {sleep} s + drain {drain} s must fit in the grace period {grace} s"
    )


@every
def test_mounts_are_where_the_settings_point(name: str) -> None:
    resources, spec = rendered(name), pod(name)
    proxy = proxy_container(spec)
    env = env_values(proxy)
    policy = Path(env["COGPROXY_POLICY"])
    source = mount_source(spec, str(policy.parent))
    keys = (
        [i["key"] for i in source["items"] if i["path"] == policy.name]
        if "items" in source
        else [policy.name]
    )
    assert keys and keys[0] in config_map(resources, source["name"])["data"]
    for directory in env["COGPROXY_MODULES"].split(":"):
        config_map(resources, mount_source(spec, directory)["name"])
    for mount in proxy["volumeMounts"]:
        assert "subPath" not in mount and "subPathExpr" not in mount, "subPath mounts never see updates"
        assert mount["readOnly"] is True


@every
def test_referenced_config_maps_exist_and_secrets_are_optional(name: str) -> None:
    resources, spec = rendered(name), pod(name)
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            config_map(resources, volume["configMap"]["name"])
    for container in spec.get("initContainers", []) + spec["containers"]:
        for env in container.get("env", []):
            ref = env.get("valueFrom", {})
            if "configMapKeyRef" in ref:
                cm = config_map(resources, ref["configMapKeyRef"]["name"])
                assert ref["configMapKeyRef"]["key"] in cm["data"]
            if "secretKeyRef" in ref:
                assert ref["secretKeyRef"]["optional"] is True
    secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in proxy_container(spec)["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert set(secrets) >= {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
    assert all(ref["key"] == env_name for env_name, ref in secrets.items())


# --- what the ConfigMaps carry --------------------------------------------------------------


@every
def test_the_policy_passes_the_proxy_validation(name: str) -> None:
    resources, spec = rendered(name), pod(name)
    policy_path = Path(env_values(proxy_container(spec))["COGPROXY_POLICY"])
    cm = config_map(resources, mount_source(spec, str(policy_path.parent))["name"])
    policy = parse_policy(
        yaml.safe_load(cm["data"][policy_path.name]), source=f"{name}: {cm['metadata']['name']}"
    )
    keys = {p.api_key_env for p in policy.providers.values() if p.api_key_env}
    assert keys <= {e["name"] for e in proxy_container(spec)["env"]}, "a provider key the pod never gets"


def test_the_deploy_copies_match_the_repository() -> None:
    """The ConfigMaps are generated from copies (kustomize reads no file outside its directory)."""
    base = K8S / "base"
    copied = yaml.safe_load((base / "policy" / "policy.yaml").read_text(encoding="utf-8"))
    assert copied == yaml.safe_load((ROOT / "policies" / "default.yaml").read_text(encoding="utf-8"))
    files = sorted(p.relative_to(base / "modules") for p in (base / "modules").rglob("*") if p.is_file())
    assert files
    for relative in files:
        original = ROOT / "modules" / relative
        assert (base / "modules" / relative).read_bytes() == original.read_bytes(), f"re-copy {original}"


@every
def test_the_modules_configmap_loads_as_the_kubelet_mounts_it(name: str, tmp_path: Path) -> None:
    resources, spec = rendered(name), pod(name)
    directory = env_values(proxy_container(spec))["COGPROXY_MODULES"]
    source = mount_source(spec, directory)
    cm = config_map(resources, source["name"])
    keys = [item["key"] for item in source["items"]]
    assert sorted(keys) == sorted(cm["data"]), "volume items and ConfigMap keys differ"
    registry = ModuleRegistry.load([mount_like_kubelet(tmp_path, cm, source)])
    assert registry.problems == ()
    assert registry.names() == sorted({Path(item["path"]).parts[0] for item in source["items"]})


async def test_the_sidecar_serves_its_configmaps(tmp_path: Path) -> None:
    """The proxy started on exactly what base mounts answers its probes and /metrics."""
    resources, spec = rendered("base"), pod("base")
    env = env_values(proxy_container(spec))
    policy_path = Path(env["COGPROXY_POLICY"])
    policy_source = mount_source(spec, str(policy_path.parent))
    modules_source = mount_source(spec, env["COGPROXY_MODULES"])
    policy_dir = mount_like_kubelet(
        tmp_path / "policy", config_map(resources, policy_source["name"]), policy_source
    )
    modules_dir = mount_like_kubelet(
        tmp_path / "modules", config_map(resources, modules_source["name"]), modules_source
    )
    admin = free_port()
    settings = Settings(
        policy_path=policy_dir / policy_path.name,
        module_dirs=(modules_dir,),
        port=0,
        admin_host="127.0.0.1",
        admin_port=admin,
        reload_interval_s=float(env.get("COGPROXY_RELOAD_INTERVAL") or DEFAULT_RELOAD_INTERVAL_S),
    )
    async with TestClient(TestServer(build_app(settings))), aiohttp.ClientSession() as session:
        proxy = proxy_container(spec)
        url = f"http://127.0.0.1:{admin}"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            response = await session.get(url + proxy[probe]["httpGet"]["path"])
            assert response.status == 200, probe
        ready = await (await session.get(url + "/readyz")).json()
        assert ready["modules"] == 2 and ready["module_problems"] == []
        metrics = await session.get(url + "/metrics")
        assert metrics.status == 200
        assert "cognitive_policy_reloads_total" in await metrics.text()


# --- security and resources ---------------------------------------------------------------


@every
def test_the_pod_and_the_proxy_run_locked_down(name: str) -> None:
    spec = pod(name)
    pod_context = spec["securityContext"]
    assert pod_context["runAsNonRoot"] is True and pod_context["runAsUser"] == UID
    assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
    context = proxy_container(spec)["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == UID
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False


@every
def test_the_proxy_has_requests_and_a_memory_limit(name: str) -> None:
    resources = proxy_container(pod(name))["resources"]
    assert resources["requests"]["cpu"] == "100m"
    request, limit = mebibytes(resources["requests"]["memory"]), mebibytes(resources["limits"]["memory"])
    assert 55 * 1e6 / 2**20 < request <= limit, "the benchmark's 55 MB RSS must fit in the request"


# --- metrics: Service, ServiceMonitor, PodMonitor -------------------------------------------


@every
def test_prometheus_finds_the_proxy(name: str) -> None:
    resources, spec = rendered(name), pod(name)
    labels = deployment(name)["spec"]["template"]["metadata"]["labels"]
    proxy = proxy_container(spec)
    container_ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    service = one(resources, "Service")
    assert selects(service["spec"]["selector"], labels)
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(service_ports) == {"admin"}
    target = service_ports["admin"]["targetPort"]
    assert container_ports.get(target, target) == admin_port(name)

    monitor = one(resources, "ServiceMonitor")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= set(service_ports)

    pod_monitor = yaml.safe_load(PODMONITOR.read_text(encoding="utf-8"))
    assert pod_monitor["kind"] == "PodMonitor" and pod_monitor["apiVersion"] == MONITORING_API
    assert selects(pod_monitor["spec"]["selector"]["matchLabels"], labels)
    assert {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]} <= set(container_ports)

    scraping = [r for r in resources if r["kind"] in CRD_KINDS]
    assert len(scraping) == 1, "one monitor per proxy, or every pod is scraped twice"


# --- overlays ---------------------------------------------------------------------------------


def redis_url(name: str) -> str:
    resources = rendered(name)
    env = {e["name"]: e for e in proxy_container(pod(name))["env"]}
    ref = env["COGPROXY_REDIS_URL"]["valueFrom"]["configMapKeyRef"]
    cm = config_map(resources, ref["name"])
    assert ref["name"].startswith("cogproxy-redis-"), (
        "the env ConfigMap keeps its hash: a new URL rolls the pods"
    )
    url: str = cm["data"][ref["key"]]
    return url


@pytest.mark.parametrize("name", ["overlays/redis", "overlays/production"])
def test_the_redis_overlay_shares_state_across_replicas(name: str) -> None:
    assert deployment(name)["spec"]["replicas"] == 3
    url = urlsplit(redis_url(name))
    assert url.scheme == "redis" and url.hostname and url.port == 6379


def test_the_managed_redis_overlay_reads_tls_and_acl_from_mounted_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rediss://, the CA and the password as files of two Secrets the proxy's group can read, no
    password in any env value or argument; and ``serve`` accepts exactly what the pod gives it."""
    name = "overlays/managed-redis"
    assert deployment(name)["spec"]["replicas"] == 3
    url = urlsplit(redis_url(name))
    assert url.scheme == "rediss" and url.hostname and url.password is None
    spec = pod(name)
    proxy = proxy_container(spec)
    env = {e["name"]: e for e in proxy["env"]}
    assert "COGPROXY_REDIS_PASSWORD" not in env and not proxy.get("args") and not proxy.get("command")
    mounts = {m["mountPath"]: m for m in proxy["volumeMounts"]}
    files = {
        var: Path(env[var]["value"]) for var in ("COGPROXY_REDIS_CA_FILE", "COGPROXY_REDIS_PASSWORD_FILE")
    }
    group = spec["securityContext"]["runAsGroup"]
    for var, path in files.items():
        secret = volumes(spec)[mounts[str(path.parent)]["name"]]["secret"]
        assert "optional" not in secret, f"{var}: without its Secret the pod must not start"
        mode = secret.get("defaultMode", 0o644)
        readable = mode & 0o004 or (mode & 0o040 and spec["securityContext"].get("fsGroup") == group)
        assert readable, f"{var}: mode {mode:o} is not readable by UID {UID}"
    ref = env["COGPROXY_REDIS_USERNAME"]["valueFrom"]["configMapKeyRef"]
    given = {var: str(path) for var, path in files.items()}
    given["COGPROXY_REDIS_URL"] = redis_url(name)
    given["COGPROXY_REDIS_USERNAME"] = config_map(rendered(name), ref["name"])["data"][ref["key"]]
    for var, value in with_secret_files(given, tmp_path).items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("COGPROXY_REDIS_PASSWORD", raising=False)
    args = build_parser().parse_args(["serve", "--policy", "p.yaml"])
    args.modules = []
    resolve_serve_options(args)
    redis = serve_settings(args).redis
    assert redis is not None
    assert (redis.username, redis.password) == ("cogproxy", PASSWORD)
    assert redis.ssl_ca_certs == str(tmp_path / files["COGPROXY_REDIS_CA_FILE"].relative_to("/"))


@pytest.mark.parametrize("name", ["base", "overlays/classic-sidecar"])
def test_single_replica_layouts_keep_state_in_memory(name: str) -> None:
    assert "COGPROXY_REDIS_URL" not in {e["name"] for e in proxy_container(pod(name))["env"]}
    assert deployment(name)["spec"]["replicas"] == 1


def test_production_budget_and_network_policy() -> None:
    name = "overlays/production"
    resources = rendered(name)
    labels = deployment(name)["spec"]["template"]["metadata"]["labels"]
    replicas = deployment(name)["spec"]["replicas"]
    budget = one(resources, "PodDisruptionBudget")
    assert selects(budget["spec"]["selector"]["matchLabels"], labels)
    assert 0 < budget["spec"]["maxUnavailable"] < replicas

    policy = one(resources, "NetworkPolicy")["spec"]
    assert selects(policy["podSelector"]["matchLabels"], labels)
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    port = admin_port(name)
    [ingress] = policy["ingress"]
    assert [(p["protocol"], p["port"]) for p in ingress["ports"]] == [("TCP", port)]
    assert ingress["from"] and all(
        "podSelector" in peer and "namespaceSelector" in peer for peer in ingress["from"]
    )

    egress = {(p["protocol"], p["port"]): rule["to"] for rule in policy["egress"] for p in rule["ports"]}
    assert set(egress) == {("UDP", 53), ("TCP", 53), ("TCP", 6379), ("TCP", 443)}
    assert egress[("UDP", 53)] == egress[("TCP", 53)]
    url = urlsplit(redis_url(name))
    assert url.hostname is not None
    redis_namespace = url.hostname.split(".")[1]  # service.namespace.svc[.cluster.local]
    [redis_peer] = egress[("TCP", url.port)]
    assert redis_peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": redis_namespace}
    [public] = egress[("TCP", 443)]
    block = public["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0"
    excluded = [ipaddress.ip_network(c) for c in block["except"]]
    for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):
        assert ipaddress.ip_network(private) in excluded


# --- the renderer itself ----------------------------------------------------------------------


def test_the_renderer_merges_containers_by_name_and_fails_loudly() -> None:
    base = {"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}]}, {"name": "b"}]}
    patch = {
        "containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}, {"name": "b", "$patch": "delete"}]
    }
    assert strategic_merge(base, patch) == {
        "containers": [{"name": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}]
    }
    with pytest.raises(KustomizeError, match="test failed"):
        json_patch(base, [{"op": "test", "path": "/containers/0/name", "value": "b"}])
    moved = json_patch(base, [{"op": "move", "from": "/containers/0", "path": "/containers/-"}])
    assert [c["name"] for c in moved["containers"]] == ["b", "a"]
