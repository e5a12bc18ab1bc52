"""README.md and docs/: links resolve, the front page stays short, every shell command names a
real `cogproxy` command and flag, written as `make install` puts it (the cheap ones are run as
written) and a real make target, and
docs/configuration.md lists exactly the flags of `cogproxy serve`."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy import memory_budget
from proxy.cli import SERVE_OPTIONS, build_parser
from proxy.policy.loader import load_policy
from proxy.settings import Settings
from tests.paths import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
# The guides the docs link to: their links are checked too.
GUIDES = [ROOT / d / "README.md" for d in ("policies", "modules", "grafana", "deploy")] + [
    ROOT / "THREAT_MODEL.md"
]
README_MAX_LINES = 260
FENCE = re.compile(r"^(`{3,})(\S*)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SHELL = {"sh", "bash", "shell", "console"}
# Subcommands cheap and side-effect free enough to run in-process as the docs write them.
RUN = {("policy", "check"), ("policy", "explain"), ("validate",), ("conformance",), ("test",)}


@dataclass(frozen=True, slots=True)
class Block:
    page: Path
    line: int
    lang: str
    text: str


def split_page(page: Path) -> tuple[str, list[Block]]:
    """The page's prose (code blocks blanked) and its fenced code blocks."""
    prose: list[str] = []
    blocks: list[Block] = []
    fence: str | None = None
    lang, start = "", 0
    body: list[str] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        opened = FENCE.match(line.strip())
        if fence is None and opened:
            fence, lang, start, body = opened.group(1), opened.group(2), number, []
            prose.append("")
        elif fence is not None and line.strip() == fence:
            blocks.append(Block(page, start, lang, "\n".join(body)))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = split_page(page)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose, re.M):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def test_the_readme_is_a_front_page() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= README_MAX_LINES


def test_the_readme_links_every_page_of_docs() -> None:
    linked = {Path(target).name for target in LINK.findall(split_page(README)[0])}
    assert {page.name for page in DOCS} <= linked


@pytest.mark.parametrize("page", PAGES + GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    """Each link to a file names one that exists, and each #anchor a heading of its page."""
    broken = []
    for target in LINK.findall(split_page(page)[0]):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, broken


ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def shell_commands(block: Block) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, `$ ` prompts honoured
    (only prompted lines are commands then), comments dropped, split at `&&`, `||`, `|`, `;`, `&`,
    leading `NAME=value` assignments dropped (the command after them is the one checked)."""
    lines = block.text.replace("\\\n", " ").splitlines()
    if any(line.startswith("$ ") for line in lines):
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    commands = []
    for line in lines:
        words: list[str] = []
        for word in [*shlex.split(line, comments=True), ";"]:
            if word in {"&&", "||", "|", ";", "&"}:
                if words:
                    commands.append(words)
                words = []
            elif words or not ENV_ASSIGNMENT.match(word):
                words.append(word)
    return commands


SHELL_BLOCKS = [b for page in PAGES + GUIDES for b in split_page(page)[1] if b.lang in SHELL]
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
MAKE_TARGETS = set(re.findall(r"^([A-Za-z0-9_-]+):", MAKEFILE, re.M))


def test_the_docs_have_shell_blocks_to_check() -> None:
    commands = [c for b in SHELL_BLOCKS for c in shell_commands(b)]
    assert sum(Path(c[0]).name == "cogproxy" for c in commands) >= 4
    assert sum(c[0] == "make" for c in commands) >= 2


def cheap(args: list[str]) -> bool:
    return tuple(args[:2]) in RUN or tuple(args[:1]) in RUN


def installed(program: str) -> str:
    """Where `make install` puts ``program`` as the docs write it (``.venv/bin/cogproxy``): the
    Makefile's own ``VENV``/``BIN``, resolved to the virtualenv running this suite."""
    venv = re.search(r"^VENV\s*\?=\s*(\S+)$", MAKEFILE, re.M)
    bin_dir = re.search(r"^BIN\s*:?=\s*\$\(VENV\)/(\S+)$", MAKEFILE, re.M)
    assert venv and bin_dir, "the Makefile no longer says where `make install` puts the venv"
    assert program == f"{venv.group(1)}/{bin_dir.group(1)}/cogproxy", program
    return str(Path(sys.executable).parent / "cogproxy")


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: f"{b.page.relative_to(ROOT)}:{b.line}")
def test_shell_commands_name_real_commands_and_flags(block: Block) -> None:
    """Every `cogproxy ...` is written one way, `.venv/bin/cogproxy` (where `make install` and
    `make run` put it: no activation needed), and parses with the CLI's own parser; the cheap ones
    run as written and exit 0 (in the guides only when the whole block is cheap: their
    walk-throughs build on each other); every `make TARGET` is a target of the Makefile."""
    commands = shell_commands(block)
    run_all = block.page in PAGES or all(cheap(c[1:]) for c in commands if Path(c[0]).name == "cogproxy")
    for words in commands:
        if words[0] == "make":
            targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
            assert set(targets) <= MAKE_TARGETS, words
        if Path(words[0]).name != "cogproxy":
            continue
        program, args = installed(words[0]), words[1:]
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:
            pytest.fail(f"{block.page.name}:{block.line}: `{shlex.join(words)}` does not parse ({exc.code})")
        if run_all and cheap(args):
            done = subprocess.run([program, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (shlex.join(words), done.stdout, done.stderr)


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve: argparse.ArgumentParser = sub.choices["serve"]
    return serve


def test_configuration_lists_exactly_the_serve_flags() -> None:
    """docs/configuration.md's table has one row per `cogproxy serve` flag, with its variable."""
    table = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(--[a-z0-9-]+)[^|]*\|.*$", table, re.M)}
    flags = {
        flag
        for action in serve_parser()._actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }
    assert set(rows) == flags
    for option in SERVE_OPTIONS:
        assert f"`COGPROXY_{option.env}`" in rows[option.flag], option.flag


def test_the_memory_table_in_deployment_md_is_the_codes() -> None:
    """docs/deployment.md "Memory" shows ``proxy.memory_budget``'s table at the defaults."""
    page = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    shown = page.split("<!-- memory-budget:", 1)[1].split("-->", 1)[1].split("<!-- /memory-budget -->", 1)[0]
    policy_path = ROOT / "policies" / "default.yaml"
    settings = Settings(policy_path=policy_path, module_dirs=())
    assert shown.strip() == memory_budget.markdown(settings, load_policy(policy_path)).strip()


def test_the_readme_states_both_ways_to_choose_the_port_and_make_honours_them() -> None:
    """`make run PORT=8081` and `COGPROXY_PORT=8081 make run`, as the quickstart writes them (dry
    run: `make -n`), both serve on 8081; the variable is not set for the other form."""
    make = shutil.which("make")
    assert make is not None, "make is not installed"
    quickstart = README.read_text(encoding="utf-8").split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    forms = re.findall(r"(?:COGPROXY_PORT=\d+ )?make run(?: PORT=\d+)?", quickstart)
    assert {"make run PORT=8081", "COGPROXY_PORT=8081 make run"} <= set(forms), forms
    env = {k: v for k, v in os.environ.items() if not k.startswith("COGPROXY_")}
    for form in ("make run PORT=8081", "COGPROXY_PORT=8081 make run"):
        line = form.replace("make run", f"{shlex.quote(make)} -s -n run")
        done = subprocess.run(
            ["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (form, done.stderr)
        serve = next(cmd for cmd in done.stdout.splitlines() if "cogproxy serve" in cmd)
        assert "--port 8081" in serve, (form, serve)
