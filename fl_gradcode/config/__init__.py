"""Run-config keys (kebab-case): one declarative table (:data:`KEYS`) and what derives from it.

``pyproject.toml``'s ``[tool.flwr.app.config]`` repeats the defaults for Flower (a test checks
they agree); ``docs/options.md`` is generated (``python -m fl_gradcode.config --write
docs/options.md``).
"""

from __future__ import annotations

from .keys import (
    DEFAULTS,
    KEYS,
    SIDES,
    Key,
    client_keys,
    coded_only_keys,
    group_values,
    key,
    merge_config,
    worker_list,
)
from .markdown import codes_markdown, options_markdown, options_page

__all__ = [
    "DEFAULTS",
    "KEYS",
    "SIDES",
    "Key",
    "client_keys",
    "coded_only_keys",
    "codes_markdown",
    "group_values",
    "key",
    "merge_config",
    "options_markdown",
    "options_page",
    "worker_list",
]
