"""``make dashboard-pictures``: the load, a real Prometheus, every panel's queries, one PNG per dashboard.

    .venv/bin/python -m tests.pictures [--duration 100] [--out docs/images]

Needs Debian's ``prometheus`` (the Makefile target installs it) and matplotlib (the ``pictures``
extra). Exits 1, naming them, when a panel's query returned no data.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from yarl import URL

from tests.fake_upstream import FakeUpstream
from tests.pictures import traffic
from tests.pictures.draw import draw_dashboard
from tests.pictures.fetch import STEP_S, PanelData, Window, expand_repeats, fetch_panel, has_data
from tests.pictures.panels import IMAGES, RATE_INTERVAL, dashboard_files, load
from tests.prometheus_e2e import PrometheusServer, run_prometheus
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process

SEED = 31


async def wait_for_scrape_after(prom: PrometheusServer, moment: float) -> None:
    """Until Prometheus holds a scrape taken after ``moment`` (polled: it scrapes every second)."""
    while True:
        found = await prom.query("max(timestamp(up))")
        if found and float(found[0]["value"][1]) > moment:
            return
        await asyncio.sleep(0.2)


async def render(prom: PrometheusServer, window: Window, out: Path, about: str) -> list[str]:
    """One PNG per dashboard in ``out``; the queries that returned no data."""
    empty = []
    for path in dashboard_files():
        dashboard = await expand_repeats(prom, load(path), window)
        panels: list[PanelData] = [
            await fetch_panel(prom, p, window) for p in dashboard.panels if p.type != "row"
        ]
        empty += [f"{dashboard.uid}: {d.panel.title}: {d.queries}" for d in panels if not has_data(d)]
        picture = out / dashboard.picture.name
        picture.write_bytes(draw_dashboard(dashboard, panels, window, about))
        print(f"{picture}: {len(panels)} panels, {picture.stat().st_size // 1024} KiB")
    return empty


def serve_args(policy: Path, keys: Path) -> list[str]:
    """``cogproxy serve`` as users run it, quiet (the request lines would drown the progress)."""
    return [
        *("--policy", str(policy), "--api-keys-file", str(keys)),
        *("--reload-interval", str(traffic.RELOAD_INTERVAL_S), "--log-level", "error"),
    ]


async def main(duration_s: float, out: Path) -> int:
    binary = shutil.which("prometheus")
    if binary is None:
        print("prometheus is missing: apt-get install -y --no-install-recommends prometheus", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dashboard-pictures-") as tmp:
        workdir = Path(tmp)
        async with FakeUpstream.start() as fake:
            policy = traffic.pictures_policy(fake)
            policy_path, keys = workdir / "policy.yaml", workdir / "keys"
            policy_path.write_text(traffic.policy_yaml(policy))
            keys.write_text(traffic.KEYS)
            auth = {"Authorization": f"Bearer {traffic.APP_KEY}"}
            async with (
                proxy_process(*serve_args(policy_path, keys), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as px,
                aiohttp.ClientSession(headers=auth) as session,
                run_prometheus(binary, workdir / "prometheus", [f"127.0.0.1:{URL(px.url).port}"]) as prom,
            ):
                await prom.wait_until_up()
                start = time.time()
                print(f"driving {duration_s:.0f} s of load (Prometheus scrapes every second) ...", flush=True)
                load = traffic.Load(session, px.url, fake, SEED)
                try:
                    await traffic.run(load, policy, policy_path, duration_s)
                finally:
                    await load.client.close()
                print(f"{load.calls} module calls; {load.refused} passthrough calls answered 5xx", flush=True)
                await wait_for_scrape_after(prom, time.time())
                window = Window(start, time.time())
                about = (
                    f"{window.seconds} s of scripted load against the fake upstream; scrape 1 s, "
                    f"$__rate_interval {RATE_INTERVAL}, step {STEP_S} s, $__range the whole run"
                )
                empty = await render(prom, window, out, about)
    if empty:
        print("panels whose queries returned no data:\n  " + "\n  ".join(empty), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.pictures", description=__doc__)
    parser.add_argument("--duration", type=float, default=100.0, help="seconds of load (default 100)")
    parser.add_argument("--out", type=Path, default=IMAGES, help=f"where the PNGs go (default {IMAGES})")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main(args.duration, args.out)))
