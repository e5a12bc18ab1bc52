"""``cogproxy serve`` with an event-loop lag probe, for ``bench.py --shadow``.

Usage: ``python tests/perf/lag_probe_proxy.py OUT.json serve ...``. A task of the proxy's own
loop sleeps ``PERIOD_S`` again and again and notes how late it woke (``time.monotonic`` stamps,
the clock the benchmark stamps its blocks with); at shutdown the samples go to ``OUT.json`` as
``[[woke_at, late_s], ...]``. Lateness is what any callback of the loop, a client's included,
waits behind the work already running (uvloop's timers round to the millisecond: the floor of
the figure, alike for every variant). A measuring tool only.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

PERIOD_S = 0.005


def probed(build: Callable[..., Any], out: Path) -> Callable[..., Any]:
    def build_probed(*args: Any, **kwargs: Any) -> Any:
        app = build(*args, **kwargs)

        async def probe_ctx(_app: Any) -> AsyncIterator[None]:
            samples: list[tuple[float, float]] = []

            async def probe() -> None:
                while True:  # the clock, not loop.time(): uvloop's is cached, in milliseconds
                    due = time.monotonic() + PERIOD_S
                    await asyncio.sleep(PERIOD_S)
                    now = time.monotonic()
                    samples.append((now, now - due))

            task = asyncio.create_task(probe())
            yield
            task.cancel()
            out.write_text(json.dumps(samples))

        app.cleanup_ctx.append(probe_ctx)
        return app

    return build_probed


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout this file is in
    from proxy import cli

    cli.build_app = probed(cli.build_app, Path(sys.argv[1]))  # type: ignore[attr-defined]
    raise SystemExit(cli.main(sys.argv[2:]))


if __name__ == "__main__":
    main()
