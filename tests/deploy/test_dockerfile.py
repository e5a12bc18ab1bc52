"""deploy/Dockerfile and .dockerignore, checked without a container engine: what it copies
exists and reaches the build context, its entrypoint and settings are the proxy's own, it
runs as a non-root user, its final stage has no compiler, and its HEALTHCHECK works."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shlex
import socket
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import build_app
from proxy.settings import Settings
from tests.deploy.facts import DEPLOY, ROOT, env_values, pod, proxy_container, routes, serve_env_vars

DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
COMPILERS = re.compile(
    r"\b(gcc|g\+\+|cc|c\+\+|clang|make|build-essential|python3?-dev|libc6?-dev|apt-get|apt|apk)\b"
)


@dataclass
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions: comments dropped, continuation lines joined."""
    result: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        if line.strip().startswith("#") or (not line.strip() and not pending):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        result.append(Instruction(keyword.upper(), " ".join(args.split())))
        pending = ""
    assert not pending, "dangling line continuation"
    return result


def stages() -> list[Stage]:
    parsed = instructions(DOCKERFILE.read_text(encoding="utf-8"))
    args: dict[str, str] = {}
    result: list[Stage] = []
    for instruction in parsed:
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(image, name))
        elif not result:
            assert instruction.keyword == "ARG", f"{instruction.keyword} before the first FROM"
            key, _, value = instruction.args.partition("=")
            args[key] = value
        else:
            result[-1].instructions.append(instruction)
    return result


def final() -> Stage:
    return stages()[-1]


def env(stage: Stage) -> dict[str, str]:
    values: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for pair in shlex.split(instruction.args):
            key, sep, value = pair.partition("=")
            assert sep, f"use ENV KEY=VALUE, not {instruction.args!r}"
            values[key] = value
    return values


def copies(stage: Stage) -> list[tuple[list[str], str, dict[str, str]]]:
    """(sources, destination, flags) of each COPY/ADD."""
    result = []
    for instruction in stage.all("COPY") + stage.all("ADD"):
        words = instruction.args.split()
        flags = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
        paths = [w for w in words if not w.startswith("--")]
        result.append((paths[:-1], paths[-1], flags))
    return result


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per .dockerignore line, with Docker's matching rules (Go's
    filepath.Match plus ``**``); a pattern that matches a directory excludes what it holds."""
    patterns = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = str(PurePosixPath(line.lstrip("!").strip().lstrip("/")))
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((negated, re.compile(regex)))
    return patterns


def ignored(relative: str) -> bool:
    parts = PurePosixPath(relative).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negated, regex in ignore_patterns():
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not negated
    return excluded


# --- structure ----------------------------------------------------------------------------


def test_multi_stage_on_slim_python() -> None:
    all_stages = stages()
    assert len(all_stages) == 2
    assert all(s.image == "python:3.11-slim" for s in all_stages)
    assert all_stages[0].name == "build"


def test_the_build_stage_builds_the_project_wheel_with_the_fast_extra() -> None:
    build = stages()[0]
    runs = " ".join(i.args for i in build.all("RUN"))
    assert re.search(r"pip wheel --wheel-dir /wheels \"?\.\[fast\]\"?", runs), runs
    assert any(dep.startswith("uvloop") for dep in PYPROJECT["project"]["optional-dependencies"]["fast"])
    copied = {source for sources, _, _ in copies(build) for source in sources}
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"]}
    needed |= {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= copied, f"setuptools needs {sorted(needed - copied)} to build the wheel"


def test_the_final_stage_installs_the_wheels_only_and_has_no_compiler() -> None:
    stage = final()
    runs = [i.args for i in stage.all("RUN")]
    assert len(runs) == 1
    assert "--mount=type=bind,from=build,source=/wheels,target=/wheels" in runs[0]
    assert re.search(r"pip install --no-index --find-links /wheels \"cognitive-proxy\[fast\]\"", runs[0])
    assert PYPROJECT["project"]["name"] == "cognitive-proxy"
    for instruction in stage.instructions:
        if instruction.keyword != "HEALTHCHECK":
            assert not COMPILERS.search(instruction.args), f"{instruction.keyword} {instruction.args}"
    assert all("from" not in flags for _, _, flags in copies(stage)), "only the wheels come from build"


def test_copied_paths_exist_and_are_in_the_build_context() -> None:
    for stage in stages():
        for sources, _, flags in copies(stage):
            if "from" in flags:
                continue
            for source in sources:
                path = ROOT / source
                assert path.exists(), f"COPY {source}: no such path in the repository"
                files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
                assert files
                for file in files:
                    relative = file.relative_to(ROOT).as_posix()
                    if "__pycache__" in relative:
                        continue
                    assert not ignored(relative), f"COPY {source}: .dockerignore drops {relative}"


def test_dockerignore_keeps_the_context_small() -> None:
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        ".pytest_cache/v/x",
        ".hypothesis/x",
        "proxy/__pycache__/app.cpython-311.pyc",
        "cognitive_proxy.egg-info/PKG-INFO",
        "deploy/Dockerfile",
    ):
        assert ignored(path), path
    for path in (
        "pyproject.toml",
        "README.md",
        "proxy/app.py",
        "proxy/schemas/policy.schema.json",
        "modules/code-reviewer/tests/case_sql_injection.expected.json",
        "policies/demo.yaml",
    ):
        assert not ignored(path), path


# --- what the image runs --------------------------------------------------------------------


def test_the_entrypoint_is_the_console_script() -> None:
    [entrypoint] = final().all("ENTRYPOINT")
    command = json.loads(entrypoint.args)
    assert command == ["cogproxy", "serve"]
    assert PYPROJECT["project"]["scripts"][command[0]] == "proxy.cli:main"
    assert serve_env_vars()  # `serve` is a subcommand whose --help runs


def test_env_vars_are_serve_settings_and_paths_are_the_documented_ones() -> None:
    stage = final()
    values = env(stage)
    cogproxy = {k for k in values if k.startswith("COGPROXY_")}
    assert cogproxy <= serve_env_vars(), sorted(cogproxy - serve_env_vars())
    assert values["COGPROXY_HOST"] == "127.0.0.1", "the keyed API listens on loopback unless opted in"
    assert values["COGPROXY_ADMIN_HOST"] == "0.0.0.0"
    [expose] = stage.all("EXPOSE")
    assert expose.args == values["COGPROXY_ADMIN_PORT"] == "9090", "only the admin port is exposed"
    assert values["COGPROXY_PORT"] == "8080"
    assert values["COGPROXY_POLICY"] == "/etc/cogproxy/policy/policy.yaml"
    destinations = {dest: sources for sources, dest, _ in copies(stage)}
    assert destinations[values["COGPROXY_MODULES"]] == ["modules"], "the bundled modules are the default"
    # The Kubernetes sidecar mounts the policy where the image expects it.
    proxy_env = env_values(proxy_container(pod("base")))
    assert proxy_env["COGPROXY_POLICY"] == values["COGPROXY_POLICY"]
    assert proxy_env["COGPROXY_MODULES"] == "/etc/cogproxy/modules"
    assert (
        f"mkdir -p {Path(values['COGPROXY_POLICY']).parent} /etc/cogproxy/modules"
        in final().all("RUN")[0].args
    )


def test_the_user_is_numeric_and_not_root() -> None:
    [user] = final().all("USER")
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    run = final().all("RUN")[0].args
    assert f"--uid {uid}" in run and f"--gid {gid}" in run
    assert pod("base")["securityContext"]["runAsUser"] == int(uid)
    assert final().instructions.index(user) > max(
        final().instructions.index(i) for i in final().all("RUN")
    ), "nothing may run as root after USER"


def healthcheck_command() -> list[str]:
    [healthcheck] = final().all("HEALTHCHECK")
    _, _, exec_form = healthcheck.args.partition(" CMD ")
    command: list[str] = json.loads(exec_form)
    return command


def test_the_healthcheck_uses_python_on_healthz() -> None:
    command = healthcheck_command()
    assert command[0] == "python" and command[1] == "-c"
    assert "/healthz" in command[2] and "GET" in routes()["/healthz"]
    assert "COGPROXY_ADMIN_PORT" in command[2], "the API port is on loopback only: probe the admin port"
    assert not re.search(r"\b(curl|wget)\b", " ".join(command))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def run_healthcheck(port: int) -> int:
    command = healthcheck_command()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *command[1:],
        env={**os.environ, "COGPROXY_ADMIN_PORT": str(port)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await asyncio.wait_for(process.wait(), timeout=20)


@pytest.mark.parametrize("up", [True, False])
async def test_the_healthcheck_passes_on_a_serving_proxy_only(up: bool) -> None:
    port = free_port()
    if not up:
        assert await run_healthcheck(port) != 0
        return
    settings = Settings(
        policy_path=ROOT / "policies" / "demo.yaml", module_dirs=(ROOT / "modules",), reload_interval_s=0
    )
    settings = dataclasses.replace(settings, admin_host="127.0.0.1", admin_port=port)
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1", port=0)):
        assert await run_healthcheck(port) == 0
