#!/usr/bin/env python
"""Write the CRD's spec.engine and spec.kvCache schemas from the engine's settings table
(api/paged_api/settings.py, api/paged_api/settings_k8s.py).

    python scripts/gen_crd_engine.py          # rewrite the blocks in the chart's CRD
    python scripts/gen_crd_engine.py --check  # exit 1 if the CRD differs from the table

Only the `engine:` and `kvCache:` blocks under spec.properties are replaced (kvCache is
added after engine when missing); the rest of the file, comments included, stays as
written. tests/charts/test_settings_table.py runs the check.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from paged_api.settings_k8s import crd_engine_schema, crd_kv_cache_schema  # noqa: E402

CRD = ROOT / "charts" / "paged-inference-operator" / "crds" / "pagedinferenceservices.yaml"
INDENT = " " * 16  # spec.properties.<name> in the CRD
BLOCKS = {"engine": crd_engine_schema, "kvCache": crd_kv_cache_schema}


def _note(name: str) -> str:
    return (f"{INDENT}# spec.{name} is generated from api/paged_api/settings.py: "
            "python scripts/gen_crd_engine.py\n")


class _Dumper(yaml.SafeDumper):
    """Block style, but lists of scalars on one line ([1, 2, 4]); list items indented."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def _list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, (list, dict)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _list)


def block(name: str) -> str:
    text = yaml.dump({name: BLOCKS[name]()}, Dumper=_Dumper, sort_keys=False,
                     width=4096, default_flow_style=False)
    return _note(name) + "".join(INDENT + line + "\n" for line in text.splitlines())


def _span(crd_text: str, name: str) -> tuple[int, int] | None:
    """Where the block `name` (with the note above it) is, if it is there."""
    start = re.search(rf"^(?:{re.escape(_note(name))})?{INDENT}{name}:\n", crd_text, re.M)
    if start is None:
        return None
    end = re.compile(rf"^ {{0,{len(INDENT)}}}\S", re.M).search(crd_text, start.end())
    assert end is not None, f"spec.{name} is the last property: expected siblings after it"
    return start.start(), end.start()


def render(crd_text: str) -> str:
    """`crd_text` with its generated blocks (and the notes above them) replaced."""
    after = None
    for name in BLOCKS:
        span = _span(crd_text, name)
        if span is None and after is None:
            raise SystemExit(f"{CRD}: no `{name}:` under spec.properties at indent "
                             f"{len(INDENT)}")
        start, end = span or (after, after)
        crd_text = crd_text[:start] + block(name) + crd_text[end:]
        after = start + len(block(name))
    return crd_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a diff")
    args = parser.parse_args(argv)
    current = CRD.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{CRD} is out of date: run python scripts/gen_crd_engine.py", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        CRD.write_text(wanted)
        print(f"updated {CRD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
