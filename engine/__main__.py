"""`python -m engine serve [MODEL] ...` and `python -m engine router ...` (also the
`paged-engine` console script)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["router"]:  # the router imports no torch/transformers: dispatch first
        from engine.router.cli import main as router_main

        return router_main(args[1:])
    from engine.entrypoints.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
