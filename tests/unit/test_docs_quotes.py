"""What the documentation quotes is quoted as it is: a fenced block right after a
``<!-- quote: PATH -->`` line (PATH from the repository root) equals that file, so the page shows
what CI runs; and every figure the README prints is stated on the results page
(docs/benchmarks.md), in the section the README links to for it."""

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
    assert set(quotes(ROOT / "docs" / "tasks.md")) == {
        "examples/own_task/myext.py",
        "examples/own_task/own_task.yaml",
        "examples/mcp/calc_server.py",
        "examples/mcp/mcp_tiny.yaml",
        "examples/mcp/session_server.py",
        "examples/mcp/session_mcp_tiny.yaml",
    }


# Every figure the README prints comes from the results page (docs/benchmarks.md): a README block
# (a paragraph, a list item or a table with the paragraph above it) that prints a figure links to
# the results page's section that states it, and each of its figures appears in that section (a
# heading down to the next heading of its level or higher, so a section holds its subsections).
# A figure is a number with a decimal point, a sign, a trailing x or %, or a unit of time or size;
# counts and settings (60 iterations, 2 cores) and numbers inside code are not figures. Each row
# of such a table is a row of the results page, whole.
RESULTS = ROOT / "docs" / "benchmarks.md"
FENCED = re.compile(r"^```.*?^```\n?", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
RESULTS_LINK = re.compile(r"\]\(docs/benchmarks\.md(?:#([\w-]+))?\)")
NOT_FIGURES = re.compile(r"`[^`\n]*`|\]\([^)]*\)|(?:arXiv|RLlib) \d+\.\d+")
START = r"(?<![\w.])(?<![A-Za-z]-)"  # not inside a word or a name (Qwen2.5, Apache-2.0)
FIGURE = re.compile(
    rf"{START}[+-]?\d+(?:,\d{{3}})*\.\d+(?:x|%)?"  # 0.646, +22.9, 1.8x
    rf"|{START}[+-]\d+(?:,\d{{3}})*(?:x|%)?(?![\w.])"  # +20, -4
    rf"|{START}\d+(?:,\d{{3}})*(?:x|%)(?![\w.])"  # 95%, 2x
    rf"|{START}\d+(?:,\d{{3}})*(?= (?:minutes|s|GiB|GB|MB|points|tokens/s)\b)"  # 24 minutes
)


def readme_blocks() -> list[str]:
    """README's prose blocks outside code fences; a table joins the paragraph above it."""
    blocks: list[str] = []
    for block in re.split(r"\n\s*\n", FENCED.sub("\n\n", (ROOT / "README.md").read_text())):
        if block.startswith("|") and blocks:
            blocks[-1] += "\n" + block
        elif block.strip() and not block.startswith("#"):
            blocks.append(block)
    return blocks


def placed_figures(text: str) -> list[tuple[int, str]]:
    """(position, figure) of each figure in the text, its sign dropped."""
    blanked = NOT_FIGURES.sub(lambda match: " " * len(match.group(0)), text)
    return [(match.start(), match.group(0).lstrip("+-")) for match in FIGURE.finditer(blanked)]


def figures(text: str) -> list[str]:
    return [figure for _, figure in placed_figures(text)]


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading (as tests/unit/test_docs_links.py computes it)."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def results_section(anchor: str | None) -> str:
    """The text of the results page's section with this anchor (the whole page for None)."""
    body = FENCED.sub("", RESULTS.read_text())
    if anchor is None:
        return body
    headings = list(HEADING.finditer(body))
    for index, match in enumerate(headings):
        if github_anchor(match.group(2)) == anchor:
            level = len(match.group(1))
            end = next((later.start() for later in headings[index + 1 :] if len(later.group(1)) <= level), len(body))
            return body[match.start() : end]
    raise AssertionError(f"README links docs/benchmarks.md#{anchor}, which has no such heading")


def stated(figure: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(figure)}(?![\d])", text) is not None


def test_every_readme_figure_is_stated_in_the_results_section_it_links():
    """A figure's source is the first link to the results page after it in its block (the link
    that closes its clause), or the block's last one where none follows."""
    unsourced = []
    for block in readme_blocks():
        printed = placed_figures(block)
        links = [(match.end(), match.group(1)) for match in RESULTS_LINK.finditer(block)]
        if printed and not links:
            unsourced.append(f"{block[:70]!r}...: figures {figures(block)} with no link to docs/benchmarks.md")
            continue
        for position, figure in printed:
            anchor = next((anchor for end, anchor in links if end > position), links[-1][1] if links else None)
            if not stated(figure, results_section(anchor or None)):
                unsourced.append(
                    f"{figure} (README: {block[max(0, position - 40) : position + 20]!r}; results: #{anchor})"
                )
    assert not unsourced, f"README figures not stated where they link on the results page: {unsourced}"


def test_every_readme_results_table_row_is_a_row_of_the_results_page():
    rows = set(RESULTS.read_text().splitlines())
    missing = [
        line
        for block in readme_blocks()
        if RESULTS_LINK.search(block)
        for line in block.splitlines()
        if line.startswith("|") and figures(line) and line not in rows
    ]
    assert not missing, f"README table rows that the results page does not hold: {missing}"


def test_figures_are_told_from_counts_and_versions():
    text = (
        "ARPO (arXiv 2507.19849) on RLlib 2.60, 60 iterations on 2 cores: 0.417 -> 0.646 (+22.9, 1.8x, 95%)"
        " in 5.7 minutes, 24 minutes, `lr: 5e-5`, [a link](docs/benchmarks.md#x-1.5), Qwen2.5-7B, Apache-2.0"
    )
    assert figures(text) == ["0.417", "0.646", "22.9", "1.8x", "95%", "5.7", "24"]
