"""MkDocs hook: writes the configuration reference page at build time.

The page is :func:`retool.config.reference.render_reference`'s output, added to
the build as a generated file (``reference/configuration.md``), so the site
always shows the config dataclasses as they are and no copy lives in git.
"""

from __future__ import annotations

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from retool.config.reference import render_reference

PAGE = "reference/configuration.md"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated reference page to the files MkDocs builds."""
    files.append(File.generated(config, PAGE, content=render_reference()))
    return files
