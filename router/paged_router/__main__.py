"""`python -m paged_router --backends URL[,URL...] | --discover SERVICE` (also the
`paged-router` console script)."""
from __future__ import annotations

import sys

from paged_router.cli import main

if __name__ == "__main__":
    sys.exit(main())
