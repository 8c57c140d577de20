"""Label and field selectors as the API server applies them to LIST and WATCH."""
from __future__ import annotations

import re
from typing import Any, Callable

Predicate = Callable[[dict[str, Any]], bool]

_SET = re.compile(r"^\s*(!?)([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)([\w./-]+)\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses: `a in (x,y),b=c` -> ['a in (x,y)', 'b=c']."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in parts + [cur] if p.strip()]


def label_selector(selector: str | None) -> Predicate:
    """`app=x,tier!=y,env in (a,b),!legacy` -> a predicate on an object's labels.

    Raises ValueError naming the term it cannot parse (answered as 400)."""
    tests: list[Callable[[dict[str, str]], bool]] = []
    for term in _split(selector or ""):
        if m := _SET.match(term):
            _, key, op, values = m.groups()
            allowed = {v.strip() for v in values.split(",")}
            tests.append((lambda k, a: lambda lab: lab.get(k) in a)(key, allowed) if op == "in"
                         else (lambda k, a: lambda lab: lab.get(k) not in a)(key, allowed))
        elif m := _EQ.match(term):
            key, op, value = m.groups()
            tests.append((lambda k, v: lambda lab: lab.get(k) == v)(key, value) if op != "!="
                         else (lambda k, v: lambda lab: lab.get(k) != v)(key, value))
        elif m := _EXISTS.match(term):
            neg, key = m.groups()
            tests.append((lambda k, n: lambda lab: (k in lab) != n)(key, bool(neg)))
        else:
            raise ValueError(f"unable to parse requirement: {term!r} in labelSelector")
    return lambda obj: all(t(obj.get("metadata", {}).get("labels") or {}) for t in tests)


def match_labels(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector object (matchLabels + matchExpressions); an empty one matches all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def _path(obj: Any, dotted: str) -> str:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def field_selector(selector: str | None) -> Predicate:
    """`metadata.name=x,involvedObject.uid!=y` on any dotted path of the object."""
    tests: list[Predicate] = []
    for term in _split(selector or ""):
        m = _EQ.match(term)
        if not m:
            raise ValueError(f"invalid fieldSelector term {term!r}: use path=value or path!=value")
        path, op, value = m.groups()
        tests.append((lambda p, v: lambda o: _path(o, p) == v)(path, value) if op != "!="
                     else (lambda p, v: lambda o: _path(o, p) != v)(path, value))
    return lambda obj: all(t(obj) for t in tests)
