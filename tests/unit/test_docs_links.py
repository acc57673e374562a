"""Every relative link of the project's markdown (README.md, CONTRIBUTING.md, docs/*.md) points to
a file that exists, and a link to a heading of a markdown file names a heading it has (GitHub's
anchors: lower case, punctuation dropped, spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced code blocks (whose ``#`` lines are no headings)."""
    return FENCE.sub("", text)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(heading) for heading in HEADING.findall(prose(page.read_text()))}


def relative_links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", prose(page.read_text()))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_the_pages_exist():
    assert all(page.is_file() for page in PAGES), [str(page) for page in PAGES if not page.is_file()]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file_and_heading(page):
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_anchors_follow_github():
    assert anchor("Learners: `bench_learner`") == "learners-bench_learner"
    assert anchor("A real model: SmolLM2-135M-Instruct") == "a-real-model-smollm2-135m-instruct"
    assert anchor("Checking an experiment before it runs") == "checking-an-experiment-before-it-runs"
