"""A file the documentation quotes whole is quoted as it is: a fenced block right after a
``<!-- quote: PATH -->`` line (PATH from the repository root) equals that file, so the page shows
what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
QUOTE = re.compile(r"^<!-- quote: (\S+) -->\n```[^\n]*\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def quotes(page: Path) -> dict[str, str]:
    """Quoted path -> the text of the block that quotes it."""
    return dict(QUOTE.findall(page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_quoted_block_equals_its_file(page):
    for path, block in quotes(page).items():
        assert block == (ROOT / path).read_text(), f"{page.relative_to(ROOT)} quotes {path} as it no longer is"


def test_the_own_task_page_quotes_the_example_ci_runs():
    assert set(quotes(ROOT / "docs" / "tasks.md")) == {"examples/own_task/myext.py", "examples/own_task/own_task.yaml"}
