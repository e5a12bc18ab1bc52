"""Hot reload: file polling (ConfigMap symlink swaps too), SIGHUP, last good policy and modules."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import signal
import weakref
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web
from structlog.testing import capture_logs

from proxy.api.app_keys import RUNTIME, Runtime, RuntimeHolder
from proxy.app import build_app
from proxy.observability.metrics import Metrics
from proxy.reload import Reloader, fingerprint
from proxy.server import settle_heap
from proxy.settings import Settings
from tests.conftest import MODULES
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import free_port, proxy_process, running_proxy, upstream_policy
from tests.support.polling import eventually, has, until
from tests.support.unreadable import UNREADABLE_SHAPES


async def models(url: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        body = await (await session.get(url + "/v1/models")).json()
    return [m["id"] for m in body["data"]]


async def reload_counts(url: str) -> str:
    async with aiohttp.ClientSession() as session:
        return await (await session.get(url + "/metrics")).text()


async def test_bad_policy_is_refused_and_the_last_good_one_keeps_serving(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = upstream_policy(fake_upstream)
    async with running_proxy(tmp_path, policy, reload_interval_s=0.05) as px:
        path = tmp_path / "policy.yaml"
        path.write_text("version: 1\nproviders: {p: {kind: openai}}\nladder: []\n")
        counted = 'cognitive_policy_reloads_total{result="error"} 1.0'
        await eventually(lambda: reload_counts(px.url), "the failed reload counted", ready=has(counted))
        reply = await px.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
        assert reply.choices[0].message.content
        policy["aliases"]["brand-new"] = "strong"
        path.write_text(yaml.safe_dump(policy))
        await eventually(lambda: models(px.url), "the reloaded policy served", ready=has("brand-new"))
        assert 'cognitive_policy_reloads_total{result="ok"} 1.0' in await reload_counts(px.url)


async def test_configmap_symlink_swap_is_picked_up(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """Kubernetes mounts a ConfigMap as files -> ..data/ -> ..<timestamp>/ and swaps ..data."""
    config = tmp_path / "config"
    first = config / "..2026_11_25_00_00_00.1"
    first.mkdir(parents=True)
    policy = upstream_policy(fake_upstream)
    (first / "policy.yaml").write_text(yaml.safe_dump(policy))
    (config / "..data").symlink_to(first.name)
    (config / "policy.yaml").symlink_to("..data/policy.yaml")
    app = build_app(
        Settings(policy_path=config / "policy.yaml", module_dirs=(MODULES,), port=0, reload_interval_s=0.05)
    )
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"
    try:
        assert "swapped-in" not in await models(url)
        second = config / "..2026_11_25_00_01_00.2"
        second.mkdir()
        policy["aliases"]["swapped-in"] = "fast"
        (second / "policy.yaml").write_text(yaml.safe_dump(policy))
        tmp_link = config / "..data_tmp"
        tmp_link.symlink_to(second.name)
        tmp_link.replace(config / "..data")  # the atomic rename kubelet does
        shutil.rmtree(first)
        await eventually(lambda: models(url), "the reloaded policy served", ready=has("swapped-in"))
    finally:
        await runner.cleanup()


async def test_broken_module_edit_keeps_the_last_good_version(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    modules = tmp_path / "modules"
    shutil.copytree(MODULES, modules)
    async with running_proxy(
        tmp_path, upstream_policy(fake_upstream), modules=(modules,), reload_interval_s=0.05
    ) as px:
        (modules / "code-reviewer" / "schema.json").write_text("{ broken")
        shutil.copytree(modules / "idea-explorer", modules / "idea-explorer-2")
        text = (modules / "idea-explorer-2" / "module.yaml").read_text()
        (modules / "idea-explorer-2" / "module.yaml").write_text(
            text.replace("name: idea-explorer", "name: idea-explorer-2")
        )
        await eventually(
            lambda: models(px.url), "the reloaded policy served", ready=has("module:idea-explorer-2")
        )
        assert "module:code-reviewer" in await models(px.url)  # last good version still served
        async with aiohttp.ClientSession() as session:
            ready = await (await session.get(px.url + "/readyz")).json()
        assert any("code-reviewer/schema.json" in p and "invalid JSON" in p for p in ready["module_problems"])


async def test_in_flight_requests_finish_on_the_policy_they_started_with(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = upstream_policy(fake_upstream)
    fake_upstream.script("cheap", Fault.slow(0.8, "old policy answer"))
    async with running_proxy(tmp_path, policy, reload_interval_s=0.05) as px:
        pending = asyncio.create_task(
            px.client().chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
            )
        )
        await until(lambda: fake_upstream.in_flight, "the call in flight", ready=lambda n: n == 1)
        policy["aliases"]["gpt-4o-mini"] = "strong"
        (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
        await eventually(lambda: reload_counts(px.url), "the reload counted", ready=has('result="ok"} 1.0'))
        reply = await pending
        assert reply.choices[0].message.content == "old policy answer"
        await px.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    assert fake_upstream.requests[-1].model == "strong"


async def test_sighup_reloads_the_policy(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    policy = upstream_policy(fake_upstream)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    args = ("--policy", str(path), "--reload-interval", "0", "--log-format", "json")
    async with proxy_process(*args) as served:
        policy["aliases"]["after-sighup"] = "fast"
        path.write_text(yaml.safe_dump(policy))
        served.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: models(served.url), "the reloaded policy served", ready=has("after-sighup"))
    logged = (served.output[0] + served.output[1]).splitlines()
    events = [json.loads(line) for line in logged if line.startswith("{")]
    # One reload, and the signal made it: with --reload-interval 0 nothing polls the file.
    assert [e["reason"] for e in events if e["event"] == "proxy.reloaded"] == ["SIGHUP"]


async def test_a_retired_runtime_is_collected_though_start_up_froze_it(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``serve`` freezes the start-up heap (``settle_heap``), the first runtime included; the
    collector never looks at frozen objects, so each reload would leak the old runtime's cycles
    (compiled schemas, modules) unless retiring it settles the heap again."""
    policy = upstream_policy(fake_upstream)
    thresholds = gc.get_threshold()
    try:
        async with running_proxy(tmp_path, policy, reload_interval_s=0.05, drain_timeout_s=0.01) as px:
            holder = px.app[RUNTIME]
            assert holder.current is not None
            module = holder.current.registry.get("code-reviewer")
            assert module is not None
            # A compiled schema validator: a function in a cycle with its own globals, as much
            # of a runtime is, so only the cycle collector frees it.
            first = weakref.ref(module.validators.data)
            del module
            settle_heap()  # as the server does once it listens
            policy["aliases"]["brand-new"] = "strong"
            (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
            await eventually(lambda: models(px.url), "the reloaded policy served", ready=has("brand-new"))

            async def collected() -> bool:
                gc.collect()  # cycles go at the next full collection; frozen ones never do
                return first() is None

            await eventually(collected, "the old runtime's validator collected")
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


async def test_every_unreadable_policy_file_is_a_counted_logged_reload_failure(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """SIGHUP with the policy path turned into each unreadable shape: each is one
    ``reloads_total{result="error"}`` and one JSON ``proxy.reload_failed`` line naming the file;
    every line the process writes stays one JSON object, and the last good policy keeps serving."""
    policy = upstream_policy(fake_upstream)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    args = ("--policy", str(path), "--reload-interval", "0", "--log-format", "json")
    async with proxy_process(*args) as served:
        for count, (make, _) in enumerate(UNREADABLE_SHAPES.values(), 1):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
            make(path)
            served.proc.send_signal(signal.SIGHUP)
            counted = f'cognitive_policy_reloads_total{{result="error"}} {count}.0'
            await eventually(lambda: reload_counts(served.url), "a failed reload counted", ready=has(counted))
        async with aiohttp.ClientSession() as session:
            reply = await session.post(
                served.url + "/v1/chat/completions",
                json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
            )
            assert reply.status == 200
    lines = [line for line in (served.output[0] + served.output[1]).splitlines() if line.strip()]
    events = [json.loads(line) for line in lines if not line.startswith("cogproxy serving on")]
    failed = [e for e in events if e["event"] == "proxy.reload_failed"]
    assert [e["error"] for e in failed] == [f"{path}: {reason}" for _, reason in UNREADABLE_SHAPES.values()]
    assert {e["path"] for e in failed} == {str(path)}


async def test_a_build_that_raises_anything_is_a_counted_reload_failure(tmp_path: Path) -> None:
    """Whatever a reload's build raises (not only ``PolicyError``) is counted and logged, and
    ``reload`` answers False: a SIGHUP task never ends in an unretrieved exception."""
    path = tmp_path / "policy.yaml"

    def build() -> Runtime:
        raise RecursionError("maximum recursion depth exceeded")

    metrics = Metrics()
    reloader = Reloader(Settings(policy_path=path, module_dirs=()), RuntimeHolder(), build, metrics)
    with capture_logs() as logs:
        assert await reloader.reload("SIGHUP") is False
    assert metrics.registry.get_sample_value("cognitive_policy_reloads_total", {"result": "error"}) == 1
    failed = [e for e in logs if e["event"] == "proxy.reload_failed"]
    assert failed == [
        {
            "event": "proxy.reload_failed",
            "log_level": "error",
            "reason": "SIGHUP",
            "path": str(path),
            "error": "RecursionError: maximum recursion depth exceeded",
            "keeping": None,
        }
    ]


def _configmap(mount: Path, version: str, files: dict[str, str], mtime_ns: int) -> None:
    """``mount`` as kubelet lays out a ConfigMap: each file a link through ``..data`` into a
    timestamped directory; a new version swaps ``..data`` in one rename."""
    target = mount / f"..{version}"
    target.mkdir(parents=True)
    for name, text in files.items():
        (target / name).write_text(text)
        os.utime(target / name, ns=(mtime_ns, mtime_ns))
        link = mount / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    swap = mount / "..data_tmp"
    swap.symlink_to(target.name)
    swap.replace(mount / "..data")


def test_the_fingerprint_sees_a_module_configmap_swap_even_to_the_same_bytes_and_times(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    mount = tmp_path / "modules" / "reviewer"
    files = {"module.yaml": "name: reviewer\n", "prompt.md": "Review.\n"}
    _configmap(mount, "2026_11_28_1", files, 1_700_000_000_000_000_000)
    settings = Settings(policy_path=policy, module_dirs=(tmp_path / "modules",))
    before = fingerprint(settings)
    assert sorted(Path(stamp[0]).name for stamp in before) == ["module.yaml", "policy.yaml", "prompt.md"]
    assert fingerprint(settings) == before  # nothing changed: the same stamps

    _configmap(mount, "2026_11_28_2", files, 1_700_000_000_000_000_000)  # new files, same bytes and times
    assert fingerprint(settings) != before


def test_the_fingerprint_skips_hidden_files_and_broken_links_and_sees_an_edit(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    module = tmp_path / "modules" / "m"
    module.mkdir(parents=True)
    (module / "module.yaml").write_text("name: m\n")
    (module / "gone.md").symlink_to(module / "never-there.md")
    settings = Settings(policy_path=policy, module_dirs=(tmp_path / "modules",))
    before = fingerprint(settings)
    assert [Path(stamp[0]).name for stamp in before] == ["policy.yaml", "module.yaml"]

    (module / ".module.yaml.swp").write_text("an editor's")
    assert fingerprint(settings) == before
    (module / "module.yaml").write_text("name: m\ntier: decision\n")
    assert fingerprint(settings) != before
