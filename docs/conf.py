"""Sphinx configuration of the reachlimit documentation (docs/).

Built by .ci/run with warnings as errors, as HTML and as doctests:

    sphinx-build -W --keep-going -b html docs docs/_build/html
    sphinx-build -W -b doctest docs docs/_build/doctest

Needs the ``docs`` extra (pip install -e '.[docs]'): Sphinx, MyST, furo, and Flask, redis-py
and prometheus_client, which the API pages import with reachlimit's edges. reachlimit itself is
imported from this checkout.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import reachlimit  # noqa: E402  (after the path: the checkout's copy)

project = "reachlimit"
author = "reachlimit maintainers"
copyright = "reachlimit maintainers"
release = reachlimit.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
]

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "grafana"]
root_doc = "index"

# MyST: GitHub-style anchors for headings down to ###, so that page.md#a-heading links work
# here as they do on a git host's rendering of the same files.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# autodoc: members in source order, signatures without the noise of every type alias.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
autoclass_content = "both"


def _public_bases(app: Sphinx, name: str, obj: type, options: object, bases: list[type]) -> None:
    """Leave out a class's private base (a mixin two public classes share code through): the
    page shows its public bases, or ``object``."""
    bases[:] = [base for base in bases if not base.__name__.startswith("_")] or [object]


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-bases", _public_bases)

# doctest: every example runs in the repository's root with the checkout importable.
doctest_global_setup = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
"""

html_theme = "furo"
html_title = f"reachlimit {release}"
html_static_path = ["_static"]
