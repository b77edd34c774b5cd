"""Sphinx configuration: MyST markdown pages and an API reference from the docstrings.

Built by `./dev docs` (`python -m sphinx -W --keep-going -b html docs docs/_build/html`):
every warning, a broken link between pages included, fails the build. Nothing is fetched from
the network (no intersphinx).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

project = "loadax_mesh"
author = "loadax_mesh developers"
copyright = "loadax_mesh developers"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# furo (pinned in the `docs` extra): its page body wraps every wide table in a scrolling box
# and scrolls a long code line, where alabaster's fixed 940 px body clipped the ranking's
# memory, step and MFU columns; the page widens with the window.
html_theme = "furo"
html_title = "loadax_mesh"
html_theme_options = {"navigation_with_keys": True}
