"""The ACL rule of docs/deployment.md against a Redis Cluster: the user created with it on every
node (a cluster does not share its ACL users), ``cogproxy serve`` with ``redis+cluster://``,
``--redis-username`` and ``--redis-password-file``: limits, the result cache, context and a
streamed answer's recovery copy all go through the cluster, and no node's ``ACL LOG`` holds a
refusal (the cluster client's own commands — the slot map, the command table — included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.api.test_limits import KEYS
from tests.api.test_managed_redis import (
    PASSWORD,
    documented_rule,
    limited_cached_policy,
    limits_cache_and_context,
    streamed_module_call,
)
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process
from tests.support.redis_cluster import Cluster, cluster_keys
from tests.support.redis_cluster import redis_cluster as redis_cluster


class EveryMaster:
    """What the managed-Redis checks ask of their admin client, over every master (a cluster
    client's ``KEYS`` asks one node)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def keys(self, pattern: str) -> list[str]:
        return await cluster_keys(self._client, pattern)


async def test_the_documented_acl_rule_is_all_a_cluster_client_needs(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_cluster: Cluster
) -> None:
    for node in redis_cluster.nodes:
        assert node.cli("acl", "setuser", "cogproxy", *documented_rule()).strip() == "OK"
    (tmp_path / "keys").write_text(KEYS, encoding="utf-8")
    (tmp_path / "password").write_text(PASSWORD + "\n", encoding="utf-8")
    (tmp_path / "policy.yaml").write_text(
        yaml.safe_dump(limited_cached_policy(fake_upstream)), encoding="utf-8"
    )
    admin = redis_cluster.admin()
    try:
        async with proxy_process(
            "--policy", str(tmp_path / "policy.yaml"), "--api-keys-file", str(tmp_path / "keys"),
            "--redis-url", redis_cluster.url,
            "--redis-username", "cogproxy", "--redis-password-file", str(tmp_path / "password"),
            env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
        ) as served:  # fmt: skip
            await limits_cache_and_context(served.url, fake_upstream, EveryMaster(admin))
            await streamed_module_call(served.url, fake_upstream, EveryMaster(admin))
            users = {node.port: node.cli("client", "list") for node in redis_cluster.nodes}
    finally:
        await admin.aclose()
    masters = {redis_cluster.master_of(key).port for key in ("{a}", "{b}", "{c}")}
    assert all("user=cogproxy" in users[port] for port in masters), (
        "the proxy reached every master as cogproxy"
    )
    denied = {node.port: node.cli("acl", "log") for node in redis_cluster.nodes}
    assert all(not log.strip() for log in denied.values()), f"the documented rule lacks: {denied}"
    out, err = served.output
    assert PASSWORD not in out + err
    assert "NOPERM" not in out + err
