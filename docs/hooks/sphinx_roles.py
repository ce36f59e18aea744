"""MkDocs hook: Sphinx cross-reference roles in docstrings shown as plain code.

The project's docstrings name other objects the Sphinx way,
``:class:`~retool.config.RunConfig```. mkdocstrings renders the role's name
literally (``:class:`` before the code), which reads as noise on the API pages;
this hook drops the role and the leading ``~``, keeping the code span. The
source docstrings stay as they are, for ``help()`` and editors.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const|ref|py:\w+):<code>~?")


def on_page_content(html: str, **kwargs: Any) -> str:
    """The page's HTML with ``:role:<code>~x`` written as ``<code>x``."""
    return _ROLE.sub("<code>", html)
