"""`python -m paged_operator`: run the operator with a liveness endpoint.

Watches every namespace unless --namespace (or $WATCH_NAMESPACE, comma-separated) names
some. With $PAGED_OPERATOR_PEERING set (the chart sets it when replicaCount > 1) the replicas
peer through kopf so that one reconciles (handlers.py); otherwise it runs standalone.
"""
from __future__ import annotations

import argparse
import os

import kopf

from . import handlers  # noqa: F401  (registers the handlers)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m paged_operator", description=__doc__)
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="namespace to watch (repeatable); default: all namespaces")
    parser.add_argument("--liveness", default=os.environ.get(
        "LIVENESS_ENDPOINT", "http://0.0.0.0:8080/healthz"),
        help="URL the liveness endpoint listens on (empty to disable)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument("--log-format", choices=["plain", "full", "json"], default="full")
    args = parser.parse_args(argv)
    namespaces = args.namespace or [
        ns.strip() for ns in os.environ.get("WATCH_NAMESPACE", "").split(",") if ns.strip()]
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    kopf.run(standalone=True, clusterwide=not namespaces, namespaces=namespaces,
             liveness_endpoint=args.liveness or None)


if __name__ == "__main__":
    main()
