"""`python -m engine serve [MODEL] ...` (also the `paged-engine` console script).

The router is a program of its own: `python -m paged_router ...` (router/paged_router/)."""
from __future__ import annotations

import sys

MOVED = ("the router moved out of the engine into a program of its own: run "
         "`python -m paged_router {args}` (or `paged-router`)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["router"]:  # moved to router/paged_router/: say where, load nothing
        raise SystemExit(MOVED.format(args=" ".join(args[1:]) or "--backends URL[,URL...]"))
    from engine.entrypoints.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
