"""Usage: ``python -m fl_gradcode.config [--write PATH | --pyproject]``: print the option page
(the run-config table and the codes, generated), write it to ``PATH`` (``docs/options.md``), or
print ``pyproject.toml``'s ``[tool.flwr.app.config]`` section."""

from __future__ import annotations

import sys
from pathlib import Path

from . import options_page, pyproject_section


def main(argv: list[str] | None = None) -> int:
    """Print or write the page; 2 (and the usage on stderr) for other arguments."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.stdout.write(options_page())
        return 0
    if args == ["--pyproject"]:
        sys.stdout.write(pyproject_section())
        return 0
    if len(args) == 2 and args[0] == "--write":
        Path(args[1]).write_bytes(options_page().encode())
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
