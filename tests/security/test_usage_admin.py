"""``GET /v1/usage`` answers only an admin key; an admin key is no client key; keys never leak
into answers or metrics (a real ``cogproxy serve`` driven with raw sockets)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import yaml
from yarl import URL

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http, request_bytes

CLIENT = "sk-client-secret-1"
ADMIN = "sk-admin-secret-9"


@pytest.fixture
async def limited(fake_upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[ServedProcess]:
    policy = security_policy(fake_upstream, limits={"clients": {"default": {"rpm": 100}}})
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    keys = tmp_path / "keys"
    keys.write_text(f"{CLIENT} name=alice team=search\n")
    async with proxy_process(
        "--policy",
        str(path),
        "--api-keys-file",
        str(keys),
        "--admin-keys",
        ADMIN,
        env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
    ) as proc:
        yield proc


async def get(served: ServedProcess, target: str, key: str | None = None) -> tuple[int, bytes]:
    url = URL(served.url)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    assert url.host is not None and url.port is not None
    resp = await raw_http(url.host, url.port, request_bytes("GET", target, headers=headers))
    return resp.status, resp.body


async def test_usage_answers_only_an_admin_key(limited: ServedProcess) -> None:
    assert (await get(limited, "/v1/usage?client=alice"))[0] == 401
    assert (await get(limited, "/v1/usage?client=alice", CLIENT))[0] == 403
    assert (await get(limited, "/v1/usage?client=alice", "sk-admin-secret-8"))[0] == 403
    status, body = await get(limited, "/v1/usage?client=alice", ADMIN)
    assert status == 200
    answer = orjson.loads(body)
    assert answer["client"] == "alice" and answer["windows"][0]["limit"] == 100
    assert CLIENT.encode() not in body and ADMIN.encode() not in body
    # an admin key opens nothing else: it is not a client key
    assert (await get(limited, "/v1/models", ADMIN))[0] == 401
    _, metrics = await get(limited, "/metrics")
    assert CLIENT.encode() not in metrics and ADMIN.encode() not in metrics


async def test_usage_is_closed_without_admin_keys(served: ServedProcess) -> None:
    for key in (None, "anything", ""):
        status, body = await get(served, "/v1/usage?client=alice", key)
        assert status in (401, 403), body
        assert orjson.loads(body)["error"]["code"] == "admin_key_required"


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    """``cogproxy serve ARGS`` run to its exit (these tests expect a refusal at start-up)."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_refuses_an_admin_key_that_is_a_client_key(tmp_path: Path) -> None:
    done = serve("--policy", str(tmp_path / "p.yaml"), "--api-keys", "sk-same", "--admin-keys", "sk-same")
    assert done.returncode == 2 and "admin key must not also be a client key" in done.stderr


def test_serve_refuses_a_malformed_keys_file_label(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-a name=alice\nsk-b role=admin\n")
    done = serve("--policy", str(tmp_path / "p.yaml"), "--api-keys-file", str(keys))
    assert done.returncode == 2 and f"{keys}:2" in done.stderr and "sk-b" not in done.stderr


def test_a_keys_file_error_never_echoes_a_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-first sk-second-secret\n")
    done = serve("--policy", str(tmp_path / "p.yaml"), "--api-keys-file", str(keys))
    assert done.returncode == 2 and f"{keys}:1" in done.stderr
    assert "sk-first" not in done.stderr and "sk-second-secret" not in done.stderr
