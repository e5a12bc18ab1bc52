"""The memory bounds against the limits they run under (issue #29 finding 5): every shipped
manifest's proxy container holds the bounds of the workers it runs, ``serve`` refuses to start
when they do not fit, and the cgroup's limit is read as the kernel writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.cli import build_parser, main, resolve_serve_options, serve_settings
from proxy.memory_budget import (
    SUPERVISOR_BYTES,
    cgroup_limit,
    memory_size,
    per_worker,
    refusal,
    total,
)
from proxy.policy.loader import load_policy
from proxy.settings import MiB, Settings
from tests.deploy.facts import KUSTOMIZATIONS, one, pod, proxy_container, rendered, with_secret_files
from tests.paths import ROOT

POLICY = ROOT / "policies" / "default.yaml"


def _container_env(name: str, container: dict[str, Any]) -> dict[str, str]:
    """The proxy container's COGPROXY_* variables, ConfigMap references resolved."""
    resources = rendered(name)
    env = {}
    for entry in container.get("env", []):
        if not entry["name"].startswith("COGPROXY_"):
            continue
        ref = entry.get("valueFrom", {}).get("configMapKeyRef")
        if ref is not None:
            env[entry["name"]] = one(resources, "ConfigMap", ref["name"])["data"][ref["key"]]
        else:
            env[entry["name"]] = str(entry["value"])
    return env


def _policy_text(name: str) -> str:
    return str(one(rendered(name), "ConfigMap", "cogproxy-policy")["data"]["policy.yaml"])


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_each_manifest_holds_the_memory_bounds_of_the_workers_it_runs(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defaults added up to more than the 256Mi limit the manifests shipped (100,000 feedback
    records alone ~220 MiB at their honest size). The container's settings and policy, read from
    the rendered manifest, fit its memory limit."""
    container = proxy_container(pod(name))
    for variable, value in with_secret_files(_container_env(name, container), tmp_path).items():
        monkeypatch.setenv(variable, value)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(_policy_text(name))
    monkeypatch.setenv("COGPROXY_POLICY", str(policy_file))
    args = build_parser().parse_args(["serve"])
    args.modules = []
    resolve_serve_options(args)
    settings = serve_settings(args)
    policy = load_policy(policy_file)
    limit = memory_size(container["resources"]["limits"]["memory"])
    assert total(settings, policy) <= limit
    assert refusal(settings, policy, limit) is None


def test_serve_refuses_to_start_past_a_memory_limit_and_names_the_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--policy", str(POLICY), "--port", "0", "--memory-limit", "64Mi"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("serve: memory bounds need ") and "over the memory limit of 64.0 MiB" in err
    for store in ("baseline", "request bodies in flight", "stream sessions", "feedback store", "media cache"):
        assert store in err
    assert "--memory-limit 0" in err


def test_workers_multiply_the_bounds_and_add_the_supervisor() -> None:
    policy = load_policy(POLICY)
    one_worker = Settings(policy_path=POLICY, module_dirs=())
    four = Settings(policy_path=POLICY, module_dirs=(), workers=4, port=8080)
    assert total(one_worker, policy) == per_worker(one_worker, policy)
    assert total(four, policy) == 4 * per_worker(one_worker, policy) + SUPERVISOR_BYTES
    fits_one = total(one_worker, policy)
    assert refusal(one_worker, policy, fits_one) is None
    refused = refusal(four, policy, fits_one)
    assert refused is not None and "x 4 workers + 32.0 MiB supervisor" in refused


def test_memory_limit_zero_starts_anyway_and_a_bad_size_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = load_policy(POLICY)
    assert refusal(Settings(policy_path=POLICY, module_dirs=()), policy, 0) is None
    monkeypatch.setenv("COGPROXY_MEMORY_LIMIT", "lots")
    assert main(["serve", "--policy", str(POLICY), "--port", "0"]) == 2
    assert "COGPROXY_MEMORY_LIMIT='lots' is not a valid memory_size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "size"),
    [("268435456", 268435456), ("320Mi", 320 * MiB), ("1Gi", 1 << 30), ("512M", 512_000_000), ("0", 0)],
)
def test_memory_sizes_read_like_kubernetes_quantities(text: str, size: int) -> None:
    assert memory_size(text) == size


@pytest.mark.parametrize("bad", ["", "-1", "1.5Gi", "12 parsecs", "Mi", "\u0661\u0662Mi", "9" * 5000])
def test_a_malformed_memory_size_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        memory_size(bad)


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"memory.max": "max\n"}, None),
        ({"memory.max": "268435456\n"}, 268435456),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1: no limit
        ({"memory/memory.limit_in_bytes": "536870912\n"}, 536870912),
        ({}, None),
    ],
    ids=["v2 max", "v2 limit", "v1 unlimited", "v1 limit", "no cgroup"],
)
def test_the_cgroup_limit_is_read_as_the_kernel_writes_it(
    tmp_path: Path, files: dict[str, str], limit: int | None
) -> None:
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert cgroup_limit(tmp_path) == limit


def test_without_a_flag_the_cgroup_limit_decides(tmp_path: Path) -> None:
    policy = load_policy(POLICY)
    settings = Settings(policy_path=POLICY, module_dirs=())
    (tmp_path / "memory.max").write_text(f"{64 * MiB}\n")
    refused = refusal(settings, policy, None, root=tmp_path)
    assert refused is not None and f"the cgroup's, {tmp_path}" in refused
    (tmp_path / "memory.max").write_text(f"{total(settings, policy)}\n")
    assert refusal(settings, policy, None, root=tmp_path) is None


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe\x00garbage\n", ("9" * 5000 + "\n").encode(), "\u0661\u0662\n".encode(), b"-1\n", b""],
    ids=["not utf-8", "5000 digits", "arabic-indic digits", "negative", "empty"],
)
def test_a_cgroup_file_the_kernel_would_not_write_means_no_limit(tmp_path: Path, content: bytes) -> None:
    """Adversarial pass #29: non-UTF-8 bytes and a number past int()'s 4300 digits were a
    traceback at startup; a value that is not the kernel's (ASCII digits or ``max``) is no limit."""
    (tmp_path / "memory.max").write_bytes(content)
    assert cgroup_limit(tmp_path) is None
