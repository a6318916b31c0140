"""Sphinx configuration of ccl's documentation site (``make docs``).

The pages are the Markdown files under docs/ (read by myst-parser, so they
stay readable on GitHub); the API reference comes from numpydoc docstrings.
``make docs`` builds with warnings as errors and then runs every doctest
block (pages and docstrings) with the doctest builder.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# build against the checkout, not a stale installed copy
sys.path.insert(0, ROOT)

import ccl  # noqa: E402

project = "ccl"
author = "the ccl authors"
copyright = "the ccl authors"
release = ccl.__version__
version = release

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Markdown: heading anchors make the pages' existing "file.md#section" links resolve.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# API reference: numpydoc renders the sections; members are listed by autodoc.
autodoc_member_order = "bysource"
# The numpydoc sections give every type in words; the annotations are for type checkers
# (their aliases and type variables, such as ccl.arguments.CodecLike and ccl._xp.ArrayT,
# are not pages of their own).
autodoc_typehints = "none"
autodoc_default_options = {"members": True}
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()  # mpi_tests/test_docstrings.py enforces the rules

# Intersphinx would need the network at build time; CI builds offline.
intersphinx_mapping = {}

# The doctest builder runs the pages' {doctest} blocks, in one process (one rank). Docstring
# examples run in their modules' namespaces, at every rank count, in
# mpi_tests/test_docstrings.py, so the rendered API pages' blocks are not run twice here.
doctest_global_setup = "import numpy as np\nimport ccl\n"
doctest_test_doctest_blocks = ""

# References that stay plain text on purpose: names from other projects' docs (no
# intersphinx offline) and numpydoc type words.
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|mpi4py|MPI|torch|cupy)(\..*)?"),
    (r"py:.*", r"(optional|hashable|mapping|iterable|callable|array_like|dtype|default)"),
    # private classes named by type hints in signatures (ccl._xp.Backend): not in the reference
    (r"py:class", r"ccl(\.\w+)*\._\w+(\.\w+)*"),
]

html_theme = "alabaster"
html_title = f"ccl {release}"
html_static_path = []
