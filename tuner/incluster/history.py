"""status.best and status.pareto of the goodput loop, from status.history."""
from __future__ import annotations


def best_of(history: list[dict]) -> dict | None:
    measured = [e for e in history if "goodput" in e]
    if not measured:
        return None
    top = max(measured, key=lambda e: e["goodput"])
    return {"engine": top["engine"], "goodput": top["goodput"], "source": "search"}


def pareto(history: list[dict], size: int = 5) -> list[dict]:
    """Search trials no other trial beats on both goodput (higher) and p99 TTFT (lower)."""
    measured = [e for e in history if "goodput" in e]
    front = [e for e in measured if not any(
        o["goodput"] >= e["goodput"] and o["ttftP99"] <= e["ttftP99"]
        and (o["goodput"], o["ttftP99"]) != (e["goodput"], e["ttftP99"]) for o in measured)]
    front.sort(key=lambda e: -e["goodput"])
    return [{"engine": e["engine"], "goodput": e["goodput"], "ttftP99": e["ttftP99"]}
            for e in front[:size]]
