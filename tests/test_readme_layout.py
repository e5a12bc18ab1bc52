"""README.md's "Layout" names every module and package of proxy/, and nothing that is gone."""

from __future__ import annotations

import re

from tests.paths import ROOT

PROXY = ROOT / "proxy"


def test_the_layout_lists_every_entry_of_proxy() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    listed = set(re.findall(r"^proxy/(\S+?)/?\s", block, re.M))
    present = {
        p.name
        for p in PROXY.iterdir()
        if p.name != "__init__.py" and not p.name.startswith(".") and (p.suffix == ".py" or p.is_dir())
    } - {"__pycache__"}
    assert listed == present
