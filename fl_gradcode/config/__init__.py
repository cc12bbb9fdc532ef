"""Run-config keys (kebab-case): one declarative table (:data:`KEYS`) and what derives from it.

``pyproject.toml``'s ``[tool.flwr.app.config]`` repeats the defaults for Flower: it is the text of
:func:`pyproject_section` (``python -m fl_gradcode.config --pyproject`` prints it; a test checks
it); ``docs/options.md`` is generated (``python -m fl_gradcode.config --write docs/options.md``).
"""

from __future__ import annotations

from .keys import (
    DEFAULTS,
    GROUPS,
    KEYS,
    KEYWORD_DEFAULTS,
    SIDES,
    Key,
    charges_sleep,
    client_keys,
    coded_only_keys,
    group_values,
    key,
    merge_config,
    worker_list,
)
from .markdown import codes_markdown, options_markdown, options_page, pyproject_section

__all__ = [
    "DEFAULTS",
    "GROUPS",
    "KEYS",
    "KEYWORD_DEFAULTS",
    "SIDES",
    "Key",
    "charges_sleep",
    "client_keys",
    "coded_only_keys",
    "codes_markdown",
    "group_values",
    "key",
    "merge_config",
    "options_markdown",
    "options_page",
    "pyproject_section",
    "worker_list",
]
