"""Render every result number, table and figure of README.md and docs/ from results/*.json.

A generated block is a marked region of a Markdown page::

    <!-- generated:NAME -->
    ... rendered by the function registered under NAME ...
    <!-- /generated:NAME -->

``python -m tools.make_docs`` rewrites every block of README.md and docs/*.md (and draws
the figures below that no experiment draws); ``--check`` rewrites nothing and exits 1 listing
the stale blocks (and any block name without a renderer). Only JSON is read: no experiment runs.
Prose around a block is hand-written and states no measured number. The renderers live in
``tools/docgen/`` (``accuracy``: time to accuracy and adaptive coding; ``measures``: every
other experiment; ``performance``: the client's cost, end-to-end and scale; ``rivals`` and
``held``: the benchmark against the rivals; ``readme``: the README's headline and figure, the
option and code tables).
"""

from __future__ import annotations

import argparse
import re
import sys

from tools.docgen import (  # noqa: F401  (renderers)
    accuracy,
    approximate,
    async_bar,
    async_margin,
    async_replication,
    async_rules,
    auto_lr,
    fedbuff,
    held,
    measures,
    participation,
    performance,
    rivals,
    slow_classes,
    unseen,
)
from tools.docgen.core import BLOCK, RENDERERS, ROOT
from tools.docgen.readme import FIGURE_CODING, draw_coding_figure

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
__all__ = ["BLOCK", "FIGURE_CODING", "PAGES", "RENDERERS", "main", "render"]


# ---------------------------------------------------------------- driver
def render(text: str, page: str) -> tuple[str, list[str]]:
    """``text`` with every block re-rendered, and the names of the stale blocks."""
    stale: list[str] = []

    def one(match: re.Match) -> str:
        name = match["name"]
        fn = RENDERERS.get(name)
        if fn is None:
            stale.append(f"{page}: {name} (no renderer)")
            return match[0]
        body = fn()
        if body is None:
            return match[0]
        new = match["open"] + body.strip("\n") + "\n" + match["close"]
        if new != match[0]:
            stale.append(f"{page}: {name}")
        return new

    return BLOCK.sub(one, text), stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="rewrite nothing; exit 1 listing the stale blocks")
    args = parser.parse_args(argv)
    stale_all: list[str] = []
    for path in PAGES:
        text = path.read_text()
        new, stale = render(text, str(path.relative_to(ROOT)))
        stale_all += stale
        if not args.check and new != text:
            path.write_text(new)
    figure = ROOT / FIGURE_CODING
    if args.check:
        if not figure.exists():
            stale_all.append(f"{FIGURE_CODING} (missing figure)")
        for line in stale_all:
            print("stale:", line)
        return 1 if stale_all else 0
    draw_coding_figure(figure)
    for line in stale_all:
        print("rewrote:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
