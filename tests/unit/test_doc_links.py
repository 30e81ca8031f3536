"""Every relative link in README.md and docs/*.md (a Markdown link or image, or a reference
definition) names a file or directory that exists, resolved from the page that holds it, as
a reader's browser or GitHub resolves it. Links to other sites and anchors within the page
are left to the reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: ``[text](target)`` and ``![alt](target "title")``; ``[label]: target`` definitions.
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
#: A scheme (``https:``, ``mailto:``) or a protocol-relative link: not a file here.
ELSEWHERE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")


def without_code(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans, where brackets are code."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def links(page: Path) -> list[str]:
    text = without_code(page.read_text())
    return INLINE.findall(text) + DEFINITION.findall(text)


def test_the_pages_have_links():
    assert len(PAGES) > 5
    assert "docs/usage.md" in links(REPO / "README.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_names_a_file_that_exists(page):
    broken = []
    for target in links(page):
        if ELSEWHERE.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert broken == [], f"{page.relative_to(REPO)}: links to nothing"
