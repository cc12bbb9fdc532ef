"""``python -m fl_gradcode.config [--write docs/options.md]``: print or write the option page."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import options_page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="PATH", help="write the page there (else print it)")
    args = parser.parse_args(argv)
    page = options_page()
    if args.write:
        Path(args.write).write_text(page, encoding="utf-8")
    else:
        print(page, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
