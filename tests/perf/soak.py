"""Soak (issue #29 findings 5 and 6): the proxy at its default bounds under steady load that fills
them, for ``BENCH_SOAK_S`` seconds (default ``DEFAULT_SOAK_S``).

Distinct module calls from three clients, half of them streamed, fill the stream sessions, the
feedback store and the result cache (the context store) of one ``cogproxy serve``. After
``WARM_UP_S`` of the same load, not measured, the load runs in equal segments
(a minute each, a fifth of the run when it is shorter); after each the bench reads the worker's
CPU time (``/proc/<pid>/stat``) and RSS. It prints CPU per request per segment and the last
segment's over the first's (flat: 1.00), and the peak RSS (VmHWM) against the memory table of
``proxy.memory_budget`` for the settings and policy it runs.

    BENCH_SOAK_S=600 .venv/bin/python tests/perf/bench.py --soak
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

DEFAULT_SOAK_S = 120
"""Long enough to fill the stream sessions and feedback store at a few hundred calls/s and to see
a trend; the 10-minute figure of docs/performance.md is ``BENCH_SOAK_S=600``."""
CONNECTIONS = 16
WARM_UP_S = 5
CLIENT_KEYS = "soak-key-0,soak-key-1,soak-key-2"
"""Three clients, each within its own quota (``cache.client_max_entries``), fill the whole store."""
WRK_SCRIPT = """
counter = 0
request = function()
  counter = counter + 1
  local body = '{"input": {"code": "def f' .. counter .. '(x):\\\\n    return x\\\\n", "language": "python"}}'
  local headers = {["Content-Type"] = "application/json"}
  headers["Authorization"] = "Bearer soak-key-" .. (counter % 3)
  if counter % 2 == 0 then headers["Accept"] = "text/event-stream" end
  return wrk.format("POST", "/v1/modules/code-reviewer/execute", headers, body)
end
"""


def soak_policy(up_port: int) -> str:
    """One rung on the no-delay upstream; answers of code-reviewer cached (the result cache);
    every store at its default bound."""
    return (
        "version: 1\n"
        f"providers:\n  up: {{kind: openai, base_url: 'http://127.0.0.1:{up_port}/v1'}}\n"
        "ladder:\n  - {name: fast, targets: [up/m]}\n"
        "cache:\n  modules:\n    code-reviewer: {ttl_s: 3600}\n"
    )


def soak_seconds() -> int:
    return int(os.environ.get("BENCH_SOAK_S", DEFAULT_SOAK_S))


def _segment(port: int, seconds: int, script: Path) -> int:
    """Requests wrk completed in one segment (any non-2xx answer is an error)."""
    url = f"http://127.0.0.1:{port}"
    out = subprocess.run(
        ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"soak: {errors[1]} non-2xx answers")
    return int(re.search(r"(\d+) requests in", out)[1])  # type: ignore[index]


def _evictions(port: int) -> str:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.findall(r'^cognitive_context_evictions_total\{reason="(\w+)"\} (\S+)', text, re.M)
    return ", ".join(f"{reason} {float(n):.0f}" for reason, n in found) or "none"


def budget_mib(policy: Path) -> float:
    from proxy import memory_budget
    from proxy.policy.loader import load_policy
    from proxy.settings import MiB, Settings

    settings = Settings(policy_path=policy, module_dirs=())
    return memory_budget.per_worker(settings, load_policy(policy)) / MiB


def soak_section(port: int, pid: int, policy: Path, tmp: Path) -> None:
    from tests.perf.bench import cpu_seconds, rss_mb

    total = soak_seconds()
    step = max(1, min(60, total // 5))
    script = tmp / "soak.lua"
    script.write_text(WRK_SCRIPT)
    _segment(port, WARM_UP_S, script)  # schemas compiled, pools and caches warm: not measured
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here
    per_request: list[float] = []
    done = 0
    print(f"soak: {total} s of distinct module calls (half streamed), c={CONNECTIONS}, segments of {step} s")
    for index in range(max(1, total // step)):
        cpu = cpu_seconds(pid)
        requests = _segment(port, step, script)
        done += requests
        per_request.append((cpu_seconds(pid) - cpu) / max(1, requests) * 1e3)
        print(
            f"soak segment {index + 1}: {requests / step:.0f} req/s, CPU {per_request[-1]:.3f} ms/request, "
            f"RSS {rss_mb(pid):.1f} MB"
        )
    print(
        f"soak: CPU per request, first segment {per_request[0]:.3f} ms, last {per_request[-1]:.3f} ms: "
        f"ratio last/first {per_request[-1] / per_request[0]:.2f}"
    )
    budget = budget_mib(policy)
    peak = rss_mb(pid, "VmHWM") * 1e6 / (1 << 20)
    print(
        f"soak: {done} calls; peak RSS {peak:.1f} MiB against the memory table's {budget:.1f} MiB per "
        f"worker ({peak / budget:.2f}); context store evictions: {_evictions(port)}"
    )


def main() -> int:
    """``bench.py --soak``: the upstream and one proxy, then the soak."""
    import tempfile

    from tests.perf.bench import ROOT, free_port, serve_command, wait_port

    up_port, port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        policy = tmp / "policy.yaml"
        policy.write_text(soak_policy(up_port))
        bench = Path(__file__).with_name("bench.py")
        upstream = subprocess.Popen([sys.executable, str(bench), "--upstream", str(up_port)])
        log = (tmp / "proxy.log").open("wb")
        command = serve_command(policy, port, "--log-level", "warning", "--api-keys", CLIENT_KEYS)
        proxy = subprocess.Popen(command, cwd=ROOT, stderr=log)
        try:
            wait_port(up_port)
            wait_port(port)
            soak_section(port, proxy.pid, policy, tmp)
        finally:
            for proc in (proxy, upstream):
                proc.terminate()
                proc.wait(timeout=30)
            log.close()
    return 0
