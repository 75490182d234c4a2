"""The code blocks of the README and the documentation pages, read from their Markdown.

A page's fenced blocks are its examples: ``python`` and ``sql`` blocks run against a test
database, ``sh`` blocks are commands checked against what they name, ``yaml`` and ``ini`` blocks
are configuration checked against the tools that read it, and ``text`` blocks are output, not
code. An HTML comment holds what a reader need not see:

    <!-- test: python
    hidden code, run in order with the page's blocks (set-up, or a check of what a block did)
    -->

    <!-- test: skip REASON -->   (before a block: not run, for the stated reason)
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]

#: Languages a block may have, and what is done with it.
RUN = frozenset({"python", "sql"})  # executed against the page's database
CHECK = frozenset({"sh", "yaml", "ini"})  # commands and configuration, checked
OUTPUT = frozenset({"text"})  # what a command prints: not code

_HIDDEN = re.compile(r"\A<!--\s*test:\s*(?P<lang>python|sql)[ \t]*\n(?P<code>.*?)-->\s*\Z", re.S)
_SKIP = re.compile(r"\A<!--\s*test:\s*skip\s+(?P<reason>.+?)\s*-->\s*\Z", re.S)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block (or hidden code) of a page."""

    page: Path
    line: int
    lang: str
    code: str
    hidden: bool = False
    skip: str | None = None
    """Why this block is not run, when a ``test: skip`` comment says so."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """Every Markdown page of the project: the README, the files beside it, the docs site."""
    top = [ROOT / name for name in ("README.md", "BENCHMARKS.md", "CHANGELOG.md") if (ROOT / name).exists()]
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return top + docs


def blocks(page: Path) -> list[Block]:
    """The page's blocks in order: fenced blocks (MyST directives such as ``{toctree}`` are not
    code) and hidden ``test:`` comments."""
    out: list[Block] = []
    skip: str | None = None
    for token in MarkdownIt("commonmark").parse(page.read_text()):
        line = (token.map[0] + 1) if token.map else 0
        if token.type == "html_block":
            if hidden := _HIDDEN.match(token.content.strip() + "\n"):
                out.append(Block(page, line, hidden["lang"], hidden["code"], hidden=True))
            elif marked := _SKIP.match(token.content.strip()):
                skip = marked["reason"]
            continue
        if token.type != "fence":
            continue
        lang = token.info.split()[0] if token.info.strip() else ""
        if lang.startswith("{"):
            continue
        out.append(Block(page, line, lang, token.content, skip=skip))
        skip = None
    return out


def examples() -> list[Block]:
    """Every visible block of every page, code and output alike."""
    return [b for page in pages() for b in blocks(page) if not b.hidden]
