"""The conformance table is the one claim: its held rows name tests that exist, the claimed level
is held, and the Conformance section of docs/contract-and-conformance.md and
``GET /v1/capabilities`` are generated from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.conformance_table import BEGIN_MARKER as BEGIN
from proxy.conformance_table import (
    CLAIMED_LEVEL,
    DOCS_PAGE,
    ROWS,
    SPEC_VERSIONS,
    Row,
    Status,
    held_level,
    markdown,
)
from proxy.conformance_table import END_MARKER as END
from tests.paths import ROOT


def _defined(node: str) -> bool:
    path, _, name = node.partition("::")
    file = ROOT / path
    if not name or not file.is_file():
        return False
    return (
        re.search(rf"^(async )?def {re.escape(name)}\(", file.read_text(encoding="utf-8"), re.M) is not None
    )


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.source}:{r.requirement[:30]}")
def test_every_row_names_tests_that_exist_and_a_held_row_names_one(row: Row) -> None:
    missing = [t for t in row.tests if not _defined(t)]
    assert not missing, f"no such test: {missing}"
    if row.status is Status.HELD:
        assert row.tests, "a held row names the test that proves it"
    else:
        assert row.note, "a row that is not held says why"


def test_a_row_claiming_held_without_a_test_fails_the_check() -> None:
    bogus = Row("x", 1, "MUST", "r", Status.HELD, ("tests/test_cli.py::test_no_such_test",))
    assert not _defined(bogus.tests[0])


def test_the_claimed_level_is_exactly_the_held_one() -> None:
    """Every MUST of the claimed level and below is held; the next level has one that is not."""
    assert held_level() == CLAIMED_LEVEL
    not_held = [
        r for r in ROWS if r.level == CLAIMED_LEVEL + 1 and r.keyword == "MUST" and r.status != "held"
    ]
    assert not_held, "the next level is fully held: claim it"


def test_a_must_not_held_lowers_the_level() -> None:
    rows = (
        Row("a", 1, "MUST", "r", Status.HELD, ("t",)),
        Row("b", 2, "SHOULD", "r", Status.NOT_IMPLEMENTED),
        Row("c", 2, "MUST", "r", Status.PARTIAL),
        Row("d", 3, "MUST", "r", Status.HELD, ("t",)),
    )
    assert held_level(rows) == 1
    assert held_level(rows[:2]) == 2


def test_the_docs_section_is_the_generated_one() -> None:
    page = (ROOT / DOCS_PAGE).read_text(encoding="utf-8")
    assert BEGIN in page and END in page
    assert page.index("## Conformance") < page.index(BEGIN), "the table is under ## Conformance"
    section = page.split(BEGIN, 1)[1].split(END, 1)[0]
    assert section.strip("\n") == markdown().strip("\n"), "run: cogproxy conformance --update-docs"


def test_the_readme_links_the_conformance_page_and_states_the_claimed_level() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert BEGIN not in readme, "the table lives in the docs page only"
    assert f"]({DOCS_PAGE}#conformance)" in readme
    assert f"**Level {CLAIMED_LEVEL}**" in readme


def test_spec_versions_include_v2_5() -> None:
    assert SPEC_VERSIONS[0] == "2.5" and "2.2" in SPEC_VERSIONS


def test_the_command_prints_the_section_and_rewrites_only_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.cli import main

    assert main(["conformance", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown()
    stale = f"# x\n\nbefore\n{BEGIN}\nstale row\n{END}\nafter\n"
    fresh = f"# x\n\nbefore\n{BEGIN}\n{markdown()}{END}\nafter\n"
    page = tmp_path / "page.md"
    page.write_text(stale, encoding="utf-8")
    assert main(["conformance", "--update-docs", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == fresh
    # Without a path: the docs page, relative to the working directory (the repository root).
    monkeypatch.chdir(tmp_path)
    (tmp_path / DOCS_PAGE).parent.mkdir(parents=True)
    (tmp_path / DOCS_PAGE).write_text(stale, encoding="utf-8")
    assert main(["conformance", "--update-docs"]) == 0
    assert (tmp_path / DOCS_PAGE).read_text(encoding="utf-8") == fresh
    # The flag's old name still works, with a path.
    page.write_text(stale, encoding="utf-8")
    assert main(["conformance", "--update-readme", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == fresh
    (tmp_path / "plain.md").write_text("# no markers\n", encoding="utf-8")
    assert main(["conformance", "--update-docs", str(tmp_path / "plain.md")]) == 2
    assert (tmp_path / "plain.md").read_text(encoding="utf-8") == "# no markers\n"
