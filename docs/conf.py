"""Sphinx configuration: the tutorial (Markdown, through MyST) and the API reference,
generated from the docstrings by autodoc. CI builds it with warnings as errors
(tests/docs/test_docs.py)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # abs_engine and operators, also without an installed package

project = "abs-engine"
author = "the abs-engine developers"
copyright = "2026, the abs-engine developers"
release = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
# A class's docstring, then its __init__'s (tests/docs/test_reference.py reads both for the
# constructor's parameters).
autoclass_content = "both"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}  # members: listed per class in api.md
# Types named only in annotations (``from __future__ import annotations``) stay text.
autodoc_type_aliases: dict[str, str] = {}

html_theme = "alabaster"
html_title = "abs-engine"
html_static_path: list[str] = []
