"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``).

The docstrings cross-reference in Sphinx's roles (``:class:`~pgsolo.Lock```), which
mkdocstrings renders as they are. Rather than rewrite every docstring for one renderer,
the rendered role becomes an autorefs link: to the name's entry on the API reference page
when it has one there, plain code otherwise (``optional``: an internal module is not an
error).
"""

from __future__ import annotations

import re
from typing import Any

# What mkdocstrings makes of :role:`~a.b.c` (or :role:`a.b.c`): the role, then the target
# as inline code.
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):<code>(~?)([\w.]+)</code>")


def _link(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    title = target.rsplit(".", 1)[-1] if tilde else target
    return f'<autoref identifier="{target}" optional><code>{title}</code></autoref>'


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(_link, html)
