"""Other gateways measured beside the proxy by ``bench.py --peers`` (and the full run).

Each peer forwards OpenAI-format chat calls to the bench's no-delay upstream with its defaults:

* Portkey's AI gateway (``@portkey-ai/gateway``, run with node): the upstream named per request
  by ``x-portkey-provider: openai`` and ``x-portkey-custom-host`` (its README's "custom host").
* LiteLLM's proxy (``litellm[proxy]`` in a venv of its own): a config whose one model points at
  the upstream's ``api_base``; a master key (it refuses to start
  without one), no database.

``make peers`` installs both at the versions pinned in the Makefile (``PORTKEY_VERSION``,
``LITELLM_VERSION``) under ``.venv-peers/`` (gitignored). A peer that is not installed, or does not
start, is left out with the reason printed: the bench never fails for it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = ROOT / ".venv-peers"
PORTKEY_PACKAGE = PEERS_DIR / "node" / "node_modules" / "@portkey-ai" / "gateway"
LITELLM_BIN = PEERS_DIR / "bin" / "litellm"
START_TIMEOUT_S = 180.0
"""LiteLLM imports for 10-60 s on a loaded 2-core machine before it listens."""
UPSTREAM_KEY = "sk-bench-peer"
"""What each peer sends the fake upstream as its key (the upstream checks none)."""


@dataclass
class Peer:
    """A running peer: where to send chat calls, the headers they need, its process."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


def _portkey(port: int, up_port: int, log: Path) -> tuple[Peer | None, str]:
    if shutil.which("node") is None:
        return None, "node is not installed"
    package = PORTKEY_PACKAGE / "package.json"
    if not package.exists():
        return None, "not installed (make peers: npm install @portkey-ai/gateway)"
    version = json.loads(package.read_text())["version"]
    command = ["node", str(PORTKEY_PACKAGE / "build" / "start-server.js"), f"--port={port}", "--headless"]
    env = {**os.environ, "NODE_ENV": "production"}  # no log console UI
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    headers = {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": f"http://127.0.0.1:{up_port}/v1",
        "Authorization": f"Bearer {UPSTREAM_KEY}",
    }
    return Peer(f"Portkey {version}", port, process, headers), ""


def litellm_config(up_port: int, master_key: str) -> str:
    """One model, ``bench`` (the bench's chat body names it), on the upstream's ``api_base``; the
    master key LiteLLM refuses to start without (checked per request, no database)."""
    return (
        "model_list:\n"
        "  - model_name: bench\n"
        "    litellm_params:\n"
        "      model: openai/m\n"
        f"      api_base: http://127.0.0.1:{up_port}/v1\n"
        f"      api_key: {UPSTREAM_KEY}\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
    )


def _litellm(port: int, up_port: int, log: Path) -> tuple[Peer | None, str]:
    if not LITELLM_BIN.exists():
        return None, "not installed (make peers: pip install litellm[proxy] in .venv-peers)"
    version = subprocess.run(
        [
            str(PEERS_DIR / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    config = log.with_suffix(".yaml")
    master_key = "sk-" + secrets.token_hex(32)
    config.write_text(litellm_config(up_port, master_key))
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the bundled price map, not a download at start
        "LITELLM_TELEMETRY": "False",
    }
    command = [str(LITELLM_BIN), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    return Peer(f"LiteLLM {version}", port, process, {"Authorization": f"Bearer {master_key}"}), ""


STARTERS = {"portkey": _portkey, "litellm": _litellm}


def _answers(peer: Peer, body: dict[str, object]) -> str:
    """'' when ``peer`` answers a chat call with 200, else what went wrong."""
    import urllib.request

    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **peer.headers}
    request = urllib.request.Request(peer.url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()
            return "" if resp.status == 200 else f"answered {resp.status}"
    except OSError as exc:
        return str(exc)[:200]


LISTEN_POLL_S = 0.2
"""How often a starting peer's port is tried."""


def _listening(port: int, process: subprocess.Popen[bytes], timeout: float) -> bool:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(LISTEN_POLL_S)  # a poll of the condition, not a wait for it
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


@contextmanager
def running_peers(
    up_port: int, ports: Iterator[int], tmp: Path, body: dict[str, object]
) -> Iterator[list[Peer]]:
    """The peers that start and answer ``body``; the others named on stdout with the reason."""
    peers: list[Peer] = []
    try:
        for key, start in STARTERS.items():
            log = tmp / f"peer-{key}.log"
            peer, reason = start(next(ports), up_port, log)
            if peer is None:
                print(f"peers: {key} left out: {reason}")
                continue
            if not _listening(peer.port, peer.process, START_TIMEOUT_S):
                tail = log.read_text(errors="replace")[-300:].strip().replace("\n", " | ")
                print(
                    f"peers: {peer.name} left out: it did not listen within {START_TIMEOUT_S:.0f} s ({tail})"
                )
                _stop(peer.process)
                continue
            problem = _answers(peer, body)
            if problem:
                print(f"peers: {peer.name} left out: a chat call failed: {problem}")
                _stop(peer.process)
                continue
            peers.append(peer)
        yield peers
    finally:
        for peer in peers:
            with suppress(OSError):
                _stop(peer.process)
