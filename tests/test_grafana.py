"""The Grafana dashboard and the Prometheus alert rules in grafana/.

Static checks (dashboard structure, template variables on every selector, rate windows,
histogram_quantile shape, metric names), promtool checks (``check rules`` on the alert rules and
on every dashboard query written as a recording rule; ``test rules`` on the alert unit tests),
and an end-to-end run: the proxy serves module and passthrough traffic against the fake
upstream, a real Prometheus scrapes it every second, and every dashboard query must return data
(at least one finite value).

promtool and prometheus come from Debian's ``prometheus`` package, installed by the session
fixture when missing (the tests fail, never skip, when it cannot be installed).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from yarl import URL

from proxy.clients import ClientIdentity
from proxy.observability.metrics import Metrics
from tests.api.test_routing import routing_policy
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream, Fault
from tests.prometheus_e2e import PrometheusError, PrometheusServer, run_prometheus
from tests.proxy_server import RunningProxy
from tests.support.polling import eventually, has, settled

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "cognitive-overview.json"
RULES = GRAFANA / "alerts" / "cognitive-rules.yml"
RULE_TESTS = GRAFANA / "alerts" / "cognitive-rules.test.yml"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yaml"
DASHBOARD_PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "cognitive.yaml"

# Every metric the proxy exports and its labels (docs/observability.md "Metrics"; instance and job
# come from scraping).
METRIC_LABELS: dict[str, frozenset[str]] = {
    "cognitive_requests_total": frozenset({"route", "module", "status", "outcome"}),
    "cognitive_confidence": frozenset({"module", "tier", "attempt"}),
    "cognitive_risk_total": frozenset({"module", "tier", "risk"}),
    "cognitive_decisions_total": frozenset({"module", "tier", "decision"}),
    "cognitive_escalations_total": frozenset({"module", "from_rung", "to_rung"}),
    "cognitive_repairs_total": frozenset({"module", "kind"}),
    "cognitive_contract_errors_total": frozenset({"module", "code"}),
    "cognitive_risk_disagreements_total": frozenset({"module"}),
    "cognitive_upstream_requests_total": frozenset({"provider", "model", "outcome"}),
    "cognitive_upstream_latency_seconds": frozenset({"provider", "model"}),
    "cognitive_failovers_total": frozenset({"from_target", "to_target", "reason"}),
    "cognitive_stream_incomplete_total": frozenset({"provider", "model", "reason"}),
    "cognitive_circuit_open": frozenset({"target"}),
    "cognitive_proxy_overhead_seconds": frozenset({"route"}),
    "cognitive_tokens_total": frozenset({"provider", "model", "kind"}),
    "cognitive_policy_reloads_total": frozenset({"result"}),
    "cognitive_cost_usd_total": frozenset({"module", "provider", "model", "client"}),
    "cognitive_savings_usd_total": frozenset({"module"}),
    "cognitive_savings_lost_usd_total": frozenset({"module"}),
    "cognitive_counterfactual_cost_usd_total": frozenset({"module"}),
    "cognitive_limited_total": frozenset({"scope", "kind", "client"}),
    "cognitive_limits_degraded": frozenset(),
    "cognitive_ttft_seconds": frozenset({"provider", "model"}),
    "cognitive_output_tokens_per_second": frozenset({"provider", "model"}),
}
HISTOGRAMS = frozenset(
    {
        "cognitive_confidence",
        "cognitive_upstream_latency_seconds",
        "cognitive_proxy_overhead_seconds",
        "cognitive_ttft_seconds",
        "cognitive_output_tokens_per_second",
    }
)
GAUGES = frozenset({"cognitive_circuit_open", "cognitive_limits_degraded"})
LIMITED_KEY = "sk-limited"
"""A client key named ``limited`` (1 request per window): its second request is refused (429)."""
TEMPLATE_VARIABLES = ("module", "tier", "instance")
DS = {"type": "prometheus", "uid": "${datasource}"}

METRIC_NAME = re.compile(r"cognitive_[a-z_]+")
SELECTOR = re.compile(r"(cognitive_[a-z_]+)(\{[^}]*\})?")
GRAFANA_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")

# A first install can take a while (apt-get update + download); the tests themselves are quick.
NEEDS_PROMETHEUS = pytest.mark.timeout(300)


# -- promtool / prometheus ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PrometheusTools:
    promtool: str
    prometheus: str


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        ["apt-get", "-o", "DPkg::Lock::Timeout=120", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )


def _tools() -> PrometheusTools | None:
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    return PrometheusTools(promtool, prometheus) if promtool and prometheus else None


@pytest.fixture(scope="session")
def prometheus_tools() -> PrometheusTools:
    """promtool and prometheus, installing Debian's ``prometheus`` package when they are missing."""
    if (tools := _tools()) is not None:
        return tools
    log: list[str] = []
    install = ("install", "-y", "--no-install-recommends", "prometheus")
    try:
        for step in (install, ("update",), install):
            done = _apt_get(*step)
            log.append(
                f"$ apt-get {' '.join(step)} -> {done.returncode}\n{done.stdout[-1500:]}{done.stderr[-1500:]}"
            )
            if step == install and done.returncode == 0:
                break
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.append(f"apt-get failed to run: {exc!r}")
    if (tools := _tools()) is None:
        pytest.fail(
            "promtool/prometheus are missing and `apt-get install -y --no-install-recommends prometheus` "
            "did not provide them (these tests need root and Debian's package):\n" + "\n".join(log),
            pytrace=False,
        )
    return tools


def promtool(tools: PrometheusTools, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tools.promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


# -- dashboard helpers ---------------------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def load_rules() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return doc


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, the ones inside (collapsed) rows included."""
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels") or [])


@dataclass(frozen=True)
class Query:
    record: str
    """``dashboard:panel_<panel id>_<target index>``"""
    title: str
    expr: str


def dashboard_queries(dashboard: dict[str, Any]) -> list[Query]:
    return [
        Query(
            f"dashboard:panel_{panel['id']}_{i}",
            f"{panel.get('title')} [{target.get('refId')}]",
            target["expr"],
        )
        for panel in walk_panels(dashboard["panels"])
        for i, target in enumerate(panel.get("targets") or [])
        if target.get("expr")
    ]


def fill_variables(expr: str, values: dict[str, str]) -> str:
    """``expr`` with each Grafana variable (``$name``, ``${name}``, ``${name:format}``) replaced
    by its value; AssertionError naming one that ``values`` lacks."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise AssertionError(f"unknown Grafana variable ${name} in {expr}")
        return values[name]

    return GRAFANA_VARIABLE.sub(replace, expr)


def substitute(expr: str, rate_interval: str) -> str:
    """Grafana variables -> valid PromQL (all values selected, fixed intervals)."""
    values = {
        "__rate_interval": rate_interval,
        "__interval": "1m",
        "datasource": "",
        **dict.fromkeys(TEMPLATE_VARIABLES, ".*"),
    }
    return fill_variables(expr, values)


def base_metric(name: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", name)


def variable(dashboard: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    assert len(found) == 1, f"template variable {name!r}: {len(found)} definitions"
    return found[0]


def variable_query(var: dict[str, Any]) -> str:
    query = var["query"]
    text: str = query["query"] if isinstance(query, dict) else query
    return text


def rule_exprs() -> list[tuple[str, str]]:
    return [(rule["alert"], rule["expr"]) for group in load_rules()["groups"] for rule in group["rules"]]


# -- static checks ---------------------------------------------------------------------------------------


def test_dashboard_structure() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "cognitive-overview"
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["title"]
    panels = list(walk_panels(dashboard["panels"]))
    assert all(isinstance(p.get("id"), int) for p in panels), [p.get("id") for p in panels]
    ids: list[int] = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    problems = []
    for panel in panels:
        name = f"panel {panel.get('id')} ({panel.get('title')!r})"
        if not panel.get("title"):
            problems.append(f"{name}: no title")
        if {"x", "y", "w", "h"} - set(panel.get("gridPos") or {}):
            problems.append(f"{name}: no gridPos")
        if panel["type"] == "row":
            continue
        if panel.get("datasource") != DS:
            problems.append(f"{name}: datasource {panel.get('datasource')} is not {DS}")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{name}: no targets")
        if len({t.get("refId") for t in targets}) != len(targets):
            problems.append(f"{name}: duplicate refIds")
        for target in targets:
            if not target.get("expr") or target.get("datasource") != DS:
                problems.append(f"{name}: target {target.get('refId')} lacks an expr or the ${{datasource}}")
    assert not problems, "\n".join(problems)


def test_dashboard_template_variables() -> None:
    dashboard = load_dashboard()
    ds = variable(dashboard, "datasource")
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for name in TEMPLATE_VARIABLES:
        var = variable(dashboard, name)
        assert var["type"] == "query" and var["datasource"] == DS, name
        assert var["multi"] is True and var["includeAll"] is True, name
        assert var.get("allValue") == ".*", f"{name}: All must match series without the label value list"
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable_query(var))
        assert match and match.group(2) == name, f"{name}: {variable_query(var)}"
        assert base_metric(SELECTOR.match(match.group(1)).group(1)) in METRIC_LABELS  # type: ignore[union-attr]


def exported_metrics() -> set[str]:
    """Every metric a proxy can export, as scraped (counters with ``_total``)."""
    metrics = Metrics()
    metrics.watch_breakers(list)
    metrics.watch_redis(lambda: True)
    metrics.watch_outbox(lambda: 0)
    families = list(metrics.registry.collect())
    return {f.name + "_total" if f.type == "counter" else f.name for f in families}


def test_exported_metrics_have_a_panel_or_a_reason() -> None:
    """grafana/README.md names every exported metric that has no panel, and the counts."""
    readme = (GRAFANA / "README.md").read_text()
    section = readme.split("| metric | why no panel |")[1].split("\n\n")[0]
    without_panel = set(re.findall(r"^\| `(cognitive_[a-z_]+)`", section, re.M))
    exported = exported_metrics()
    assert without_panel == exported - set(METRIC_LABELS)
    assert f"exports {len(exported)} metrics" in readme
    assert f"chart {len(METRIC_LABELS)} of them. These\n{len(without_panel)} have no panel" in readme


def test_dashboard_has_the_promised_panels() -> None:
    panels = [p for p in walk_panels(load_dashboard()["panels"]) if p["type"] != "row"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    used = {base_metric(m) for m in METRIC_NAME.findall(exprs)}
    assert used == set(METRIC_LABELS), f"metrics with no panel: {sorted(set(METRIC_LABELS) - used)}"
    heatmaps = [p for p in panels if p["type"] == "heatmap"]
    assert heatmaps and heatmaps[0].get("repeat") == "module"
    target = heatmaps[0]["targets"][0]
    assert "cognitive_confidence_bucket{" in target["expr"] and 'attempt="final"' in target["expr"]
    assert target.get("format") == "heatmap"
    for q in ("0.1", "0.5"):
        assert f"histogram_quantile({q}, sum by (le, module) (rate(cognitive_confidence_bucket{{" in exprs
    for q in ("0.5", "0.99"):
        assert (
            f"histogram_quantile({q}, sum by (le, provider, model) (rate(cognitive_upstream_latency" in exprs
        )
        assert f"histogram_quantile({q}, sum by (le, route) (rate(cognitive_proxy_overhead_seconds" in exprs
    assert "sum by (from_rung, to_rung)" in exprs
    assert "sum by (module, tier, decision)" in exprs


def test_every_dashboard_selector_filters_by_the_template_variables() -> None:
    problems = []
    for query in dashboard_queries(load_dashboard()):
        for match in SELECTOR.finditer(query.expr):
            name, matchers = match.group(1), match.group(2) or ""
            labels = METRIC_LABELS.get(base_metric(name), frozenset())
            for var in TEMPLATE_VARIABLES:
                if (var in labels or var == "instance") and f'{var}=~"${var}"' not in matchers:
                    problems.append(f'{query.title}: {name}{matchers} lacks {var}=~"${var}"')
    assert not problems, "\n".join(problems)


def test_counters_and_histograms_are_rated_over_the_rate_interval() -> None:
    problems = []
    for query in dashboard_queries(load_dashboard()):
        expr = query.expr
        for match in SELECTOR.finditer(expr):
            name = match.group(1)
            before, after = expr[: match.start()], expr[match.end() :]
            if base_metric(name) in GAUGES:
                if after.startswith("["):
                    problems.append(f"{query.title}: gauge {name} used as a range")
                continue
            if not after.startswith("[$__rate_interval])") or not re.search(r"\b(rate|increase)\($", before):
                problems.append(f"{query.title}: {name} not in rate()/increase() over [$__rate_interval]")
            if name.endswith("_bucket") and not re.search(
                r"sum by \(le\b[^)]*\) \((rate|increase)\($", before
            ):
                problems.append(f"{query.title}: {name} not summed by (le, ...)")
        for call in re.finditer(r"histogram_quantile\(", expr):
            if not re.match(
                r"0?\.\d+, sum by \(le\b[^)]*\) \(rate\(cognitive_[a-z_]+_bucket\{", expr[call.end() :]
            ):
                problems.append(
                    f"{query.title}: histogram_quantile not over sum by (le, ...) of rate(_bucket)"
                )
    assert not problems, "\n".join(problems)


def test_metric_names_are_the_ones_the_proxy_exports() -> None:
    dashboard = load_dashboard()
    texts = [q.expr for q in dashboard_queries(dashboard)]
    texts += [variable_query(variable(dashboard, name)) for name in TEMPLATE_VARIABLES]
    texts += [expr for _, expr in rule_exprs()]
    texts += [s["series"] for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for s in t["input_series"]]
    names = {base_metric(m) for text in texts for m in METRIC_NAME.findall(text)}
    assert names, "no metric names found"
    assert names <= set(METRIC_LABELS), f"unknown metrics: {sorted(names - set(METRIC_LABELS))}"
    for name in names:  # _bucket/_sum/_count only on histograms
        raw = {m for text in texts for m in METRIC_NAME.findall(text) if base_metric(m) == name}
        assert name in HISTOGRAMS or raw == {name}, raw


def test_alert_rules_shape() -> None:
    alerts: dict[str, dict[str, Any]] = {}
    for group in load_rules()["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert rule["alert"] not in alerts, f"duplicate alert {rule['alert']}"
            alerts[rule["alert"]] = rule
    assert set(alerts) == {
        "CognitiveRejectOrReviewRateHigh",
        "CognitiveEscalationRateJump",
        "CognitiveConfidenceDrop",
        "CognitiveConfidenceLow",
        "CognitiveCircuitBreakerOpen",
        "CognitiveProxyOverheadHigh",
        "CognitivePolicyReloadFailed",
    }
    for name, rule in alerts.items():
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name}: for {rule.get('for')!r}"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        for key in ("summary", "description", "runbook"):
            assert len(rule["annotations"].get(key, "").strip()) > 20, f"{name}: annotation {key}"
    assert "offset 1h" in alerts["CognitiveEscalationRateJump"]["expr"]
    assert "offset 1d" in alerts["CognitiveConfidenceDrop"]["expr"]
    assert "cognitive_circuit_open) == 1" in alerts["CognitiveCircuitBreakerOpen"]["expr"]
    assert alerts["CognitiveCircuitBreakerOpen"]["for"] == "5m"
    assert alerts["CognitiveProxyOverheadHigh"]["for"] == "10m"
    assert 'result="error"' in alerts["CognitivePolicyReloadFailed"]["expr"]


def test_provisioning_files() -> None:
    ds = yaml.safe_load(DATASOURCES.read_text())
    assert ds["apiVersion"] == 1
    [prom] = ds["datasources"]
    assert prom["type"] == "prometheus" and prom["url"] == "${PROMETHEUS_URL}" and prom["access"] == "proxy"
    assert "http://localhost:9090" in DATASOURCES.read_text(), "the default URL is documented"
    dash = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())
    assert dash["apiVersion"] == 1
    [provider] = dash["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    readme = (GRAFANA / "README.md").read_text()
    for needle in ("PROMETHEUS_URL", "COGNITIVE_DASHBOARDS_DIR", "promtool", "tests/test_grafana.py"):
        assert needle in readme, needle


# -- promtool ----------------------------------------------------------------------------------------------


@NEEDS_PROMETHEUS
def test_promtool_accepts_the_alert_rules(prometheus_tools: PrometheusTools) -> None:
    done = promtool(prometheus_tools, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


@NEEDS_PROMETHEUS
def test_alert_rule_unit_tests(prometheus_tools: PrometheusTools, tmp_path: Path) -> None:
    """promtool test rules on cognitive-rules.test.yml; annotations are stripped from a copy of the
    rules because promtool compares them verbatim (their templates are checked by check rules)."""
    rules = load_rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / RULES.name).write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    done = promtool(prometheus_tools, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@NEEDS_PROMETHEUS
def test_every_dashboard_query_is_valid_promql(prometheus_tools: PrometheusTools, tmp_path: Path) -> None:
    queries = dashboard_queries(load_dashboard())
    rules = [{"record": q.record, "expr": substitute(q.expr, "5m")} for q in queries]
    assert len({r["record"] for r in rules}) == len(rules)
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    done = promtool(prometheus_tools, "check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


# -- end to end --------------------------------------------------------------------------------------------

REVIEW_INPUT = {"code": "def f(x):\n    return x\n", "language": "python"}
PATCH_INPUT = {"config": '{"a": 1}', "format": "json", "request": "set a to 2"}


def review_answer(confidence: float, risk: str = "low") -> str:
    return json.dumps(
        {
            "ok": True,
            "meta": {"confidence": confidence, "risk": risk, "explain": "e"},
            "data": {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"},
        }
    )


def patch_answer(confidence: float, change_risk: str = "low") -> str:
    """A config-patcher answer; its meta.risk is "low" whatever ``change_risk`` its change lists."""
    return json.dumps(
        {
            "ok": True,
            "meta": {"confidence": confidence, "risk": "low", "explain": "Unsure."},
            "data": {
                "patch": [{"op": "replace", "path": "/a", "value": 2}],
                "changes": [
                    {"type": "update_setting", "description": "a", "scope": "key", "risk": change_risk}
                ],
                "result_config": '{"a": 2}',
                "rationale": "Set a.",
            },
        }
    )


def e2e_policy(fake: FakeUpstream) -> dict[str, Any]:
    """Two targets on the first rung; one failure opens a breaker, which stays open for the test.
    Priced targets (cost, savings) and a client limited to one request per window (429s)."""
    policy = routing_policy(fake, circuit_breaker={"consecutive_failures": 1, "window_s": 60, "open_s": 300})
    cheap = {"input_per_mtok": 0.15, "output_per_mtok": 0.6}
    policy["prices"] = {
        "up/cheap": cheap,
        "up/backup": cheap,
        "up/strong": {"input_per_mtok": 2.5, "output_per_mtok": 10.0},
    }
    # a day's window: both rounds of traffic fall in one (a minute's could roll over between them,
    # and the client's first request of round two would be answered)
    policy["limits"] = {"clients": {"limited": {"rpm": 1}}, "window_s": 86_400}
    return policy


async def proxy_metrics(session: aiohttp.ClientSession, px: RunningProxy) -> str:
    async with session.get(px.url + "/metrics") as resp:
        return await resp.text()


async def wait_for_metric(session: aiohttp.ClientSession, px: RunningProxy, line: str) -> None:
    await eventually(lambda: proxy_metrics(session, px), f"the proxy exporting {line!r}", ready=has(line))


async def wait_for_query(prom: PrometheusServer, expr: str, timeout: float = 10.0) -> None:
    await eventually(lambda: prom.query(expr), f"Prometheus seeing {expr}", timeout=timeout, step=0.2)


async def execute(session: aiohttp.ClientSession, px: RunningProxy, module: str, data: dict[str, Any]) -> str:
    """Run a module over /execute; the X-Cognitive-Decision header."""
    async with session.post(px.base + f"/modules/{module}/execute", json={"input": data}) as resp:
        await resp.read()
        return resp.headers.get("X-Cognitive-Decision", f"HTTP {resp.status}")


async def reload_policy(
    session: aiohttp.ClientSession, px: RunningProxy, policy: dict[str, Any], policy_path: Path
) -> None:
    """A broken policy file (refused: result="error"), then the good one again (result="ok")."""
    policy_path.write_text("version: 1\nproviders: {p: {kind: openai}}\nladder: []\n")
    await wait_for_metric(session, px, 'cognitive_policy_reloads_total{result="error"}')
    policy_path.write_text(yaml.safe_dump(json.loads(json.dumps(policy))))
    await wait_for_metric(session, px, 'cognitive_policy_reloads_total{result="ok"}')


async def drive_traffic(
    session: aiohttp.ClientSession, px: RunningProxy, fake: FakeUpstream, *, failover: bool
) -> dict[str, str]:
    """Module answers of every decision, a repair, a contract error, plain and streamed passthrough,
    and (``failover``) a failover that opens up/cheap's breaker for the rest of the test.

    Returns what each step got (decision header or reply text), for failure messages.
    """
    got: dict[str, str] = {}

    async def step(name: str, module: str, data: dict[str, Any], **replies: list[str | Fault]) -> None:
        fake.reset()
        for model, script in replies.items():
            fake.script(model, *script)
        got[name] = await execute(session, px, module, data)

    low, high = review_answer(0.4), review_answer(0.9)
    await step("accept", "code-reviewer", REVIEW_INPUT, cheap=[review_answer(0.92)])
    await step("repair (risk LOW)", "code-reviewer", REVIEW_INPUT, cheap=[review_answer(0.92, "LOW")])
    await step("escalate", "code-reviewer", REVIEW_INPUT, cheap=[low], strong=[high])
    await step("review", "code-reviewer", REVIEW_INPUT, cheap=[low], strong=[review_answer(0.5)])
    await step(
        "contract error", "code-reviewer", REVIEW_INPUT, cheap=["this is not JSON at all"], strong=[high]
    )
    await step("reject", "config-patcher", PATCH_INPUT, cheap=[patch_answer(0.6)], strong=[patch_answer(0.6)])
    understated = patch_answer(0.95, "high")
    await step("risk understated", "config-patcher", PATCH_INPUT, cheap=[understated], strong=[understated])

    fake.reset()
    client = px.client()
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    reply = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    got["passthrough"] = reply.choices[0].message.content or ""
    stream = await client.chat.completions.create(
        model="gpt-4o-mini", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    got["streamed passthrough"] = "".join(
        [c.choices[0].delta.content or "" async for c in stream if c.choices]
    )
    fake.script("cheap", Fault.truncate(2))  # cut after two chunks: ends with an SSE error event
    body = {"model": "gpt-4o-mini", "messages": messages, "stream": True}
    async with session.post(px.base + "/chat/completions", json=body) as resp:
        got["truncated stream"] = (await resp.read()).decode()[-120:]
    limited = []
    for _ in range(2):
        async with session.post(
            px.base + "/chat/completions",
            json={"model": "gpt-4o-mini", "messages": messages},
            headers={"Authorization": f"Bearer {LIMITED_KEY}"},
        ) as resp:
            await resp.read()
            limited.append(str(resp.status))
    got["limited"] = ",".join(limited)

    if failover:  # up/cheap answers 500, up/backup answers; one failure opens cheap's breaker (open_s 300)
        await step(
            "failover", "code-reviewer", REVIEW_INPUT, cheap=[Fault.http(500)], backup=[review_answer(0.92)]
        )
    return got


EXPECTED_TRAFFIC = {
    "accept": "accept",
    "repair (risk LOW)": "accept",
    "escalate": "escalated",
    "review": "review",
    "contract error": "escalated",
    "reject": "reject",
    "risk understated": "reject",
}
# Series the traffic above must produce, as the README describes the metrics (checked alongside the
# dashboard queries, so a missing or mislabelled metric is named in the failure message).
EXPECTED_SERIES = [
    *(
        f'cognitive_decisions_total{{module="code-reviewer", tier="decision", decision="{d}"}}'
        for d in ("accept", "escalated", "review")
    ),
    'cognitive_decisions_total{module="config-patcher", tier="exec", decision="reject"}',
    'cognitive_confidence_bucket{module="code-reviewer", tier="decision", attempt="final", le="1.0"}',
    'cognitive_confidence_bucket{module="code-reviewer", tier="decision", attempt="intermediate", le="0.5"}',
    'cognitive_risk_total{module="code-reviewer", tier="decision", risk="low"}',
    'cognitive_escalations_total{module="code-reviewer", from_rung="fast", to_rung="strong"}',
    'cognitive_repairs_total{module="code-reviewer", kind="enum_normalized"}',
    'cognitive_contract_errors_total{module="code-reviewer", code="E1000"}',
    'cognitive_risk_disagreements_total{module="config-patcher"}',
    'cognitive_requests_total{route="/v1/modules/{name}/execute", module="code-reviewer", status="200"}',
    'cognitive_requests_total{route="/v1/chat/completions", module="none", status="200"}',
    'cognitive_upstream_requests_total{provider="up", model="cheap", outcome="ok"}',
    'cognitive_upstream_requests_total{provider="up", model="cheap", outcome="server_error"}',
    'cognitive_upstream_latency_seconds_count{provider="up", model="strong"}',
    'cognitive_failovers_total{from_target="up/cheap", to_target="up/backup", reason="server_error"}',
    'cognitive_circuit_open{target="up/cheap"} == 1',
    'cognitive_stream_incomplete_total{provider="up", model="cheap", reason="truncated"}',
    'cognitive_proxy_overhead_seconds_count{route="/v1/chat/completions"}',
    *(
        f'cognitive_tokens_total{{provider="up", model="cheap", kind="{k}"}}'
        for k in ("prompt", "completion")
    ),
    *(f'cognitive_policy_reloads_total{{result="{r}"}}' for r in ("ok", "error")),
    'cognitive_cost_usd_total{module="code-reviewer", provider="up", model="strong", client="other"}',
    'cognitive_cost_usd_total{module="none", provider="up", model="cheap", client="limited"}',
    'cognitive_savings_usd_total{module="code-reviewer"}',
    'cognitive_savings_lost_usd_total{module="code-reviewer"}',
    'cognitive_limited_total{scope="client", kind="requests", client="limited"}',
    'cognitive_ttft_seconds_count{provider="up", model="cheap"}',
    'cognitive_output_tokens_per_second_count{provider="up", model="cheap"}',
    "cognitive_limits_degraded == 0",
]


@dataclass
class Outcome:
    empty: list[str]
    errors: list[str]
    unhealthy_rules: list[str]
    empty_variables: list[str]
    missing_series: list[str]

    @property
    def ok(self) -> bool:
        return not (
            self.empty or self.errors or self.unhealthy_rules or self.empty_variables or self.missing_series
        )

    def report(self) -> str:
        sections = {
            "empty dashboard queries": self.empty,
            "query errors": self.errors,
            "empty template variables": self.empty_variables,
            "alert rules that failed to evaluate": self.unhealthy_rules,
            "expected series missing": self.missing_series,
        }
        return "".join(f"\n{title}:\n  " + "\n  ".join(items) for title, items in sections.items() if items)


async def evaluate(prom: PrometheusServer, queries: list[Query], dashboard: dict[str, Any]) -> Outcome:
    outcome = Outcome([], [], [], [], [])
    for expr in EXPECTED_SERIES:
        try:
            if not await prom.query(expr):
                outcome.missing_series.append(expr)
        except PrometheusError as exc:
            outcome.missing_series.append(f"{expr}: {exc}")
    for query in queries:
        expr = substitute(query.expr, "1m")
        try:
            result = await prom.query(expr)
            if not any(math.isfinite(float(sample["value"][1])) for sample in result):
                outcome.empty.append(f"{query.title}: {expr}" + (" (only NaN)" if result else ""))
        except PrometheusError as exc:
            outcome.errors.append(f"{query.title}: {expr}: {exc}")
    for name in TEMPLATE_VARIABLES:
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable_query(variable(dashboard, name)))
        assert match is not None
        values = await prom.api(
            f"label/{match.group(2)}/values", {"match[]": substitute(match.group(1), "1m")}
        )
        if not values:
            outcome.empty_variables.append(f"${name}: {match.group(0)}")
    for group in (await prom.api("rules"))["groups"]:
        for rule in group["rules"]:
            if rule["health"] != "ok":
                outcome.unhealthy_rules.append(
                    f"{rule['name']}: {rule['health']} {rule.get('lastError', '')}"
                )
    return outcome


@NEEDS_PROMETHEUS
async def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    prometheus_tools: PrometheusTools, tmp_path: Path, proxy_with: ProxyWith
) -> None:
    dashboard = load_dashboard()
    queries = dashboard_queries(dashboard)
    async with FakeUpstream.start() as fake:
        policy = e2e_policy(fake)
        async with (
            proxy_with(
                policy, reload_interval_s=0.2, client_identities={LIMITED_KEY: ClientIdentity("limited")}
            ) as px,
            aiohttp.ClientSession() as session,
            run_prometheus(
                prometheus_tools.prometheus,
                tmp_path / "prometheus",
                [f"127.0.0.1:{URL(px.url).port}"],
                rule_files=[RULES],
            ) as prom,
        ):
            await prom.wait_until_up()
            await reload_policy(session, px, policy, tmp_path / "policy.yaml")
            # Round one creates the series, round two (after a scrape) moves them: rate() > 0 and
            # real quantiles rather than NaN.
            first = await drive_traffic(session, px, fake, failover=False)
            await wait_for_query(prom, 'sum(cognitive_requests_total{route="/v1/chat/completions"}) >= 2')
            got = await drive_traffic(session, px, fake, failover=True)
            for traffic in (first, got):
                decisions = {name: traffic.get(name) for name in EXPECTED_TRAFFIC}
                assert decisions == EXPECTED_TRAFFIC, f"the traffic did not do what the test needs: {traffic}"
                assert traffic["passthrough"] and traffic["streamed passthrough"], traffic
            assert got["failover"] == "accept", got
            assert got["limited"] == "429,429" and first["limited"] == "200,429", (first, got)
            # Wait for a scrape after round two, and one rule evaluation.
            outcome = await settled(  # poll step: Prometheus scrapes every second
                lambda: evaluate(prom, queries, dashboard), ready=lambda o: o.ok, timeout=15, step=0.25
            )
            exported = {
                base_metric(line.split("{")[0].split(" ")[0])
                for line in (await proxy_metrics(session, px)).splitlines()
                if line.startswith("cognitive_")
            }
    missing = sorted(set(METRIC_LABELS) - exported)
    assert outcome.ok, (
        f"{len(outcome.empty)} of {len(queries)} dashboard queries returned nothing"
        + outcome.report()
        + f"\nmetrics the proxy does not export (no samples): {missing}\ntraffic: {got}"
    )
