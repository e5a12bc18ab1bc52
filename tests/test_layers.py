"""The layer rule import-linter cannot state: ``aiohttp.web`` (serving HTTP, reading a request) is
imported by the edge and the API only. Below them, ``pyproject.toml``'s forbidden contract keeps
``aiohttp`` itself out of the service, the runtime and the domain (but the media fetcher)."""

from __future__ import annotations

import ast

from tests.paths import ROOT

PROXY = ROOT / "proxy"
SERVES_HTTP = ("api/", "app.py", "server.py", "reload.py", "cli.py", "supervisor.py", "__main__.py")
"""The edge and the API, relative to ``proxy/``."""


def imports_aiohttp_web(source: str) -> bool:
    """Whether a module imports ``aiohttp.web`` (or one of its ``aiohttp.web_*`` parts) in any form."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(n == "aiohttp.web" or n.startswith(("aiohttp.web.", "aiohttp.web_")) for n in names):
            return True
    return False


def test_the_check_sees_every_form_of_the_import() -> None:
    for source in (
        "from aiohttp import web",
        "import aiohttp.web",
        "from aiohttp.web import Request",
        "from aiohttp.web_request import Request",
        "from aiohttp import hdrs, web as w",
    ):
        assert imports_aiohttp_web(source), source
    assert not imports_aiohttp_web("import aiohttp\nfrom aiohttp import ClientSession, hdrs")


def test_only_the_edge_and_the_api_import_aiohttp_web() -> None:
    offenders = sorted(
        str(path.relative_to(PROXY))
        for path in PROXY.rglob("*.py")
        if not str(path.relative_to(PROXY)).startswith(SERVES_HTTP) and imports_aiohttp_web(path.read_text())
    )
    assert offenders == []
    assert imports_aiohttp_web((PROXY / "api" / "middleware.py").read_text())  # the check is live
