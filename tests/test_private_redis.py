"""The suite talks only to the Redis it started itself (never one on 6379 it found running)."""

from __future__ import annotations

import redis

from tests.support.redis_server import redis_url, server_pid


def test_the_suites_redis_is_the_process_this_run_started() -> None:
    client = redis.Redis.from_url(redis_url(15))
    try:
        info = client.info("server")
    finally:
        client.close()
    assert info["process_id"] == server_pid()


def test_every_database_url_points_at_that_server() -> None:
    urls = {redis_url(db) for db in (11, 14, 15)}
    ports = {url.rsplit(":", 1)[1].split("/")[0] for url in urls}
    assert len(ports) == 1
