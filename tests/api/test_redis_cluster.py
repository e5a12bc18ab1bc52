"""Two proxy replicas sharing their limits through a real Redis Cluster (3 masters, 3 replicas,
tests/support/redis_cluster.py), and the limits' master killed under light load: every request
is still answered (the limits fall back to local windows while the slot fails over)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import yaml

from tests.api.test_limits import KEYS, post_chat, priced
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process
from tests.support.polling import wait_sync
from tests.support.redis_cluster import Cluster
from tests.support.redis_cluster import redis_cluster as redis_cluster

RPM = 5


async def test_two_replicas_share_limits_through_a_cluster_and_survive_a_master_failover(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_cluster: Cluster
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(priced(fake_upstream, {"clients": {"alice": {"rpm": RPM}}})))
    args = (
        *("--policy", str(policy), "--api-keys-file", str(keys)),
        *("--redis-url", redis_cluster.url, "--redis-limits-timeout", "5"),
    )
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    async with (
        proxy_process(*args, env=env) as one,
        proxy_process(*args, env=env) as two,
        aiohttp.ClientSession() as session,
    ):
        replicas = (one, two)
        statuses = [
            (await post_chat(session, replicas[i % 2].url, "sk-alice")).status for i in range(2 * RPM)
        ]
        assert statuses == [200] * RPM + [429] * (10 - RPM)  # one window across both replicas
        redis_cluster.kill_master_of("{cogproxy:limits}:x")
        during = [(await post_chat(session, replicas[i % 2].url, "sk-bob")).status for i in range(20)]
        assert during == [200] * 20  # bob has no limit: answered while the slot fails over
        wait_sync(redis_cluster.healthy, "the replica taking over the killed master's slots", timeout=30)
