"""Render the chart's Grafana dashboard to a PNG with matplotlib, from the same PromQL.

Grafana does not install here (not on PyPI, npm or Debian), so this evaluates every panel's
queries of charts/paged-inference-operator/dashboards/paged-inference.json as Grafana would
(range queries over the time range, the template variables substituted) against a real
Prometheus, and draws one subplot per panel. The figure says it was rendered with
matplotlib, not Grafana.

    scripts/local-cluster up /tmp/lc && kubectl apply -f examples/service-cpu.yaml ... (load)
    python scripts/render_dashboard.py --cluster /tmp/lc --minutes 5 --out docs/dashboard.png

The functions (load_dashboard, panel_queries, expand, query_range) are what
tests/local_cluster/test_dashboard.py uses to check every panel returns data.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "charts" / "paged-inference-operator" / "dashboards" / "paged-inference.json"
LABEL = "rendered with matplotlib from the dashboard's PromQL, not Grafana"
UNITS = {"s": "seconds", "percentunit": "fraction (1 = 100%)", "reqps": "requests/s",
         "short": ""}


@dataclass(frozen=True)
class PanelQuery:
    row: str            # the row the panel sits under
    title: str
    unit: str
    ref_id: str
    expr: str           # as written in the dashboard, template variables unexpanded
    legend: str


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def panel_queries(dashboard: dict[str, Any]) -> list[PanelQuery]:
    """Every query target of every panel, in layout order (rows hold their panels flat,
    as Grafana stores an expanded row)."""
    out, row = [], ""
    for panel in sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"],
                                                            p["gridPos"]["x"])):
        if panel["type"] == "row":
            row = panel["title"]
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        for target in panel["targets"]:
            out.append(PanelQuery(row, panel["title"], unit, target["refId"], target["expr"],
                                  target.get("legendFormat", "")))
    return out


def expand(expr: str, variables: dict[str, str], rate_interval: str) -> str:
    """Substitute `$name` / `${name}` and `$__rate_interval` as Grafana does; a variable the
    caller did not give is a ValueError naming it."""
    values = {**variables, "__rate_interval": rate_interval}

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise ValueError(f"no value for the dashboard variable ${name} in {expr!r}: "
                             f"pass it (known: {sorted(values)})")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)


def query_range(prometheus: str, expr: str, start: float, end: float,
                step: float) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    """Prometheus /api/v1/query_range: [(labels, [(t, value), ...]), ...]; NaN kept as NaN."""
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}",
                                     "end": f"{end:.3f}", "step": f"{step:g}"})
    url = f"{prometheus.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.load(response)
    except urllib.error.HTTPError as e:   # a bad query: Prometheus says why in the body
        raise ValueError(f"Prometheus refused {expr!r}: {e.read().decode()[:300]}") from None
    return [(s["metric"], [(float(t), float(v)) for t, v in s["values"]])
            for s in body["data"]["result"]]


def finite_points(series: list[tuple[dict[str, str], list[tuple[float, float]]]]) -> int:
    return sum(1 for _, values in series for _, v in values if math.isfinite(v))


def legend(fmt: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    return text or ",".join(f"{k}={v}" for k, v in labels.items()) or "value"


def render(prometheus: str, out: Path, *, variables: dict[str, str], start: float,
           end: float, rate_interval: str, dashboard: dict[str, Any] | None = None) -> dict:
    """Draw every panel; returns {panel title: finite points} (0 = the panel is empty)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = dashboard or load_dashboard()
    queries = panel_queries(dashboard)
    titles = list(dict.fromkeys((q.row, q.title) for q in queries))
    rows = list(dict.fromkeys(row for row, _ in titles))
    # like Grafana's 24-column grid: each row's panels share the full width
    fig = plt.figure(figsize=(22, 3.6 * len(rows)))
    grid = fig.add_gridspec(len(rows), 12, hspace=0.55, wspace=2.2)
    step = max(1.0, (end - start) / 300)
    points: dict[str, int] = {}
    for i, row in enumerate(rows):
        in_row = [t for r, t in titles if r == row]
        width = 12 // len(in_row)
        for j, title in enumerate(in_row):
            ax = fig.add_subplot(grid[i, j * width:(j + 1) * width])
            points[title] = 0
            for q in (q for q in queries if (q.row, q.title) == (row, title)):
                series = query_range(prometheus, expand(q.expr, variables, rate_interval),
                                     start, end, step)
                points[title] += finite_points(series)
                for labels, values in series:
                    ax.plot([(t - start) / 60 for t, _ in values], [v for _, v in values],
                            label=legend(q.legend, labels), linewidth=1.2)
                unit = q.unit
            ax.set_title(title, fontsize=10)
            ax.set_ylabel(UNITS.get(unit, unit), fontsize=8)
            ax.set_xlim(0, (end - start) / 60)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if i == len(rows) - 1:
                ax.set_xlabel("minutes", fontsize=8)
            if points[title]:
                ax.legend(fontsize=7, loc="upper left")
            else:
                ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center",
                        color="grey")
            if j == 0:
                ax.annotate(row, xy=(0, 1.16), xycoords="axes fraction", fontsize=11,
                            fontweight="bold")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(end))
    fig.suptitle(f"{dashboard['title']}: namespace={variables.get('namespace')} "
                 f"pod=~{variables.get('pod')}, rate interval {rate_interval}, "
                 f"{(end - start) / 60:.0f} min to {when}\n{LABEL}", fontsize=12)
    fig.subplots_adjust(left=0.04, right=0.99, top=1 - 0.5 / len(rows) / 1.6, bottom=0.05)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--prometheus", help="Prometheus URL")
    where.add_argument("--cluster", type=Path,
                       help="a local cluster's folder (its cluster.json names Prometheus)")
    parser.add_argument("--namespace", default="default", help="the $namespace variable")
    parser.add_argument("--pod", default=".*", help="the $pod variable (a regex)")
    parser.add_argument("--minutes", type=float, default=10, help="time range, ending now")
    parser.add_argument("--rate-interval", default="10s",
                        help="what $__rate_interval becomes (Grafana: 4x the scrape interval)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args(argv)
    url = args.prometheus or json.loads((args.cluster / "cluster.json").read_text())["prometheus"]
    end = time.time()
    points = render(url, args.out, variables={"namespace": args.namespace, "pod": args.pod},
                    start=end - 60 * args.minutes, end=end, rate_interval=args.rate_interval)
    for title, n in points.items():
        print(f"{n:6d} points  {title}")
    print(f"wrote {args.out} ({LABEL})")
    return 0 if all(points.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
