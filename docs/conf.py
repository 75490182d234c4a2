"""Sphinx configuration of aioqueue's documentation site.

The pages are Markdown (MyST), readable as files on GitHub; the API reference is generated from
the package's docstrings (autodoc) and the command reference from its argparse parser. Built by
``.ci/run`` with warnings as errors:

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import aioqueue

project = "aioqueue"
author = "the aioqueue authors"
copyright = "the aioqueue authors"
version = release = aioqueue.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinxarg.ext",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}

html_theme = "furo"
html_title = f"aioqueue {release}"


def setup(app: object) -> None:
    """Highlight ``sql`` blocks as PostgreSQL's dialect (dollar-quoted function bodies)."""
    from pygments.lexers.sql import PostgresLexer

    app.add_lexer("sql", PostgresLexer)  # type: ignore[attr-defined]
