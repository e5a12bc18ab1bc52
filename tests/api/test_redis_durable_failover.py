"""``--redis-durable-replicas 1`` end to end, against a real Redis Cluster (3 masters, 3 replicas,
tests/support/redis_cluster.py) whose master is killed (SIGKILL) and replaced by its replica:

* every record the proxy confirmed (``cognitive_outbox_pending`` back to 0 once ``WAIT`` counted
  the replica) is on the promoted replica: feedback records, review stream entries, session states;
* the contrast, side by side: a proxy without the flag pops the records its master acknowledged
  while the replica lagged, and they are gone after the failover; the proxy with the flag held
  them and writes them to the new master.

The replica is made to lag with SIGSTOP and a full replication link
(tests/support/replication.py: a pause alone leaves the stream in the kernel's buffers, which the
replica reads once resumed). Every record is written to the one master killed: the context slot's
(one client namespace), a review stream and trace ids (``X-Request-Id``) chosen on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.clients import ANONYMOUS
from proxy.context.identity import Identity, namespace_of
from proxy.state.feedback import KEY_PREFIX as FEEDBACK_PREFIX
from tests.context.helpers import LOGIN, REVIEWER, reviewer_answer
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process, upstream_policy
from tests.support.polling import eventually, until
from tests.support.redis_cluster import Cluster, Node
from tests.support.redis_cluster import redis_cluster as redis_cluster
from tests.support.replication import stall_replication

ENV = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
DURABLE = ("--redis-durable-replicas", "1")
CALLS = 4
"""Module calls per proxy: every other one accepted (a session state), every other reviewed (a
review stream entry); each leaves a feedback record."""
FAILOVER_TIMEOUT_S = 30.0
DELIVERY_TIMEOUT_S = 30.0
REVIEWED = reviewer_answer(2, "risky", confidence=0.95, risk="high")
"""An answer every rung gives with high risk: the decision tier sends it to review."""
NAMESPACE = Identity(namespace_of(ANONYMOUS))
"""The context namespace of every call (the proxy has no client keys): its slot is the master's."""


@dataclass
class Records:
    """What one proxy's calls left in Redis: each call's trace id (a feedback record), the trace
    ids sent to review (stream entries), the accepted calls' sessions (session states)."""

    traces: list[str] = field(default_factory=list)
    reviewed: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)

    async def found_on(self, node: Any, stream: str) -> Records:
        """The part of these records ``node`` (a client of one node) holds."""
        entries = await node.xrange(stream) if await node.exists(stream) else []
        in_stream = {fields["trace_id"] for _, fields in entries}
        return Records(
            [trace for trace in self.traces if await node.exists(FEEDBACK_PREFIX + trace)],
            [trace for trace in self.reviewed if trace in in_stream],
            [sid for sid in self.sessions if await node.exists(state_key(sid))],
        )

    def __bool__(self) -> bool:
        return bool(self.traces or self.reviewed or self.sessions)


async def all_on(node: Any, records: Records, stream: str) -> Records:
    """Wait until ``node`` holds every one of ``records``; what it holds."""
    return await eventually(
        lambda: records.found_on(node, stream),
        f"every record on the node {node.connection_pool.connection_kwargs['port']}",
        ready=lambda found: found == records,
        timeout=DELIVERY_TIMEOUT_S,
    )


def state_key(session: str) -> str:
    return NAMESPACE.key(session, "session_state")


def keys_on(cluster: Cluster, master: Node, prefix: str) -> Iterator[str]:
    """``prefix0``, ``prefix1``, ... those whose slot ``master`` serves."""
    return (key for key in (f"{prefix}{n}" for n in count()) if cluster.master_of(key) is master)


@dataclass
class Shard:
    """The master every record goes to, its replica, and the review stream on it."""

    master: Node
    replica: Node
    stream: str

    @classmethod
    def of_the_context_slot(cls, cluster: Cluster) -> Shard:
        master = cluster.master_of(NAMESPACE.key("probe"))
        return cls(master, cluster.replica_of(master), next(keys_on(cluster, master, "cognitive:review:")))


def client_of(node: Node) -> Any:
    """A client of ``node`` alone (it answers for the slots it serves)."""
    return aioredis.Redis(host="127.0.0.1", port=node.port, decode_responses=True)


@asynccontextmanager
async def proxy_on(
    tmp_path: Path, name: str, cluster: Cluster, shard: Shard, fake: FakeUpstream, *flags: str
) -> AsyncIterator[ServedProcess]:
    policy = {**upstream_policy(fake), "review": {"sink": "redis-stream", "stream": shard.stream}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(policy), encoding="utf-8")
    async with proxy_process("--policy", str(path), "--redis-url", cluster.url, *flags, env=ENV) as served:
        yield served


async def call(
    session: aiohttp.ClientSession, served: ServedProcess, cluster: Cluster, shard: Shard, name: str
) -> Records:
    """``CALLS`` calls of interactive-reviewer, each its own session, trace ids on the shard."""
    feedback_keys = keys_on(cluster, shard.master, f"{FEEDBACK_PREFIX}{name}-")
    records = Records()
    for n in range(CALLS):
        trace = next(feedback_keys).removeprefix(FEEDBACK_PREFIX)
        sid = f"{name}-{n}"
        headers = {"X-Cognitive-Session": sid, "X-Request-Id": trace}
        url = f"{served.url}/v1/modules/{REVIEWER}/execute"
        async with session.post(url, json={"input": LOGIN}, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["X-Cognitive-Trace-Id"] == trace
            decision = resp.headers["X-Cognitive-Decision"]
        records.traces.append(trace)
        if decision == "review":
            records.reviewed.append(trace)
        else:
            assert decision == "accept"
            records.sessions.append(sid)
    assert records.reviewed and records.sessions
    return records


def script_answers(fake: FakeUpstream) -> None:
    """Accepted and reviewed answers in turn, for every call of the test."""
    answers = [reviewer_answer(1, f"turn-{n}") if n % 2 else REVIEWED for n in range(4 * CALLS)]
    fake.script("cheap", *answers)
    fake.set_default_reply("strong", REVIEWED)


async def metric(session: aiohttp.ClientSession, served: ServedProcess, name: str) -> float:
    async with session.get(served.url + "/metrics") as resp:
        text = await resp.text()
    return next(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


async def pending(session: aiohttp.ClientSession, served: ServedProcess) -> float:
    """``cognitive_outbox_pending``: records the outbox holds, not written or not confirmed."""
    return await metric(session, served, "cognitive_outbox_pending")


async def shortfalls(session: aiohttp.ClientSession, served: ServedProcess) -> float:
    return await metric(session, served, "cognitive_outbox_replica_shortfalls_total")


async def emptied(session: aiohttp.ClientSession, served: ServedProcess, what: str) -> None:
    """Wait until ``served``'s outbox holds nothing."""
    await eventually(
        lambda: pending(session, served), what, ready=lambda n: n == 0, timeout=DELIVERY_TIMEOUT_S
    )


async def fell_short(session: aiohttp.ClientSession, served: ServedProcess) -> None:
    """Wait until a batch of ``served``'s outbox was not confirmed by the replica (and kept)."""
    what = "a batch the replica did not confirm"
    await eventually(lambda: shortfalls(session, served), what, timeout=DELIVERY_TIMEOUT_S)


async def promoted(cluster: Cluster, shard: Shard) -> None:
    """Wait until the killed master's replica serves its slots."""
    await until(cluster.healthy, "the replica promoted", timeout=FAILOVER_TIMEOUT_S, step=0.1)
    assert cluster.master_of(NAMESPACE.key("probe")) is shard.replica


async def test_records_confirmed_by_the_replica_survive_their_masters_kill(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_cluster: Cluster
) -> None:
    """While the replica is paused the records reach the master but stay in the outbox (``WAIT 1``
    counts 0); resumed, the replica confirms them (pending back to 0); the master is killed at once
    and every confirmed record is on the replica that took over, with nothing left to resend."""
    script_answers(fake_upstream)
    shard = Shard.of_the_context_slot(redis_cluster)
    master, replica = client_of(shard.master), client_of(shard.replica)
    async with (
        proxy_on(tmp_path, "durable", redis_cluster, shard, fake_upstream, *DURABLE) as durable,
        aiohttp.ClientSession() as session,
    ):
        try:
            redis_cluster.pause(shard.replica)
            records = await call(session, durable, redis_cluster, shard, "confirmed")
            await fell_short(session, durable)
            held = await pending(session, durable)
            on_master = await all_on(master, records, shard.stream)
            redis_cluster.resume()
            await emptied(session, durable, "the replica's confirmation (the outbox empty)")
            redis_cluster.kill(shard.master)
            await promoted(redis_cluster, shard)
            on_new_master = await records.found_on(replica, shard.stream)
            still_pending = await pending(session, durable)
        finally:
            redis_cluster.resume()
            await master.aclose()
            await replica.aclose()
    assert held >= len(records.traces) + len(records.reviewed) + len(records.sessions)
    assert on_master == records
    assert on_new_master == records  # at once: the outbox had nothing left to resend
    assert still_pending == 0


async def test_without_the_flag_a_write_the_master_acknowledged_is_lost_with_it(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_cluster: Cluster
) -> None:
    """Two proxies on one cluster, one with ``--redis-durable-replicas 1``. The replica is paused
    and its link filled; both proxies' records reach the master, which answers. The plain proxy
    pops them (pending 0); the durable one keeps them. The master is killed, the replica resumed and
    promoted: the plain proxy's records are gone for good, the durable proxy's are written to the
    new master (and stay held: it has no replica left to confirm them)."""
    script_answers(fake_upstream)
    shard = Shard.of_the_context_slot(redis_cluster)
    master, replica = client_of(shard.master), client_of(shard.replica)
    async with (
        proxy_on(tmp_path, "plain", redis_cluster, shard, fake_upstream) as plain,
        proxy_on(tmp_path, "durable", redis_cluster, shard, fake_upstream, *DURABLE) as durable,
        aiohttp.ClientSession() as session,
    ):
        try:
            redis_cluster.pause(shard.replica)
            await stall_replication(master, NAMESPACE.key("filler"))
            lost = await call(session, plain, redis_cluster, shard, "plain")
            kept = await call(session, durable, redis_cluster, shard, "durable")
            await emptied(session, plain, "the plain proxy's pops on the master's answer")
            await fell_short(session, durable)
            acknowledged = [await all_on(master, records, shard.stream) for records in (lost, kept)]
            held = await pending(session, durable)
            redis_cluster.kill(shard.master)
            redis_cluster.resume()
            await promoted(redis_cluster, shard)
            rewritten = await all_on(replica, kept, shard.stream)  # resent by the durable proxy
            gone = await lost.found_on(replica, shard.stream)
            after = (await pending(session, plain), await pending(session, durable))
        finally:
            redis_cluster.resume()
            await master.aclose()
            await replica.aclose()
    assert acknowledged == [lost, kept]  # the master had both proxies' records before the kill
    assert held > 0
    assert rewritten == kept
    assert not gone, f"records acknowledged while the replica was held back survived the kill: {gone}"
    assert after[0] == 0 and after[1] > 0  # nothing to resend; held: no replica left to confirm
