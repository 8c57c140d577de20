"""`python -m paged_router --port P --backends URL[,URL...] | --discover SERVICE`."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from engine.listen import listen_socket
from paged_router.policies import POLICIES

SHUTDOWN_GRACE_SECONDS = 30   # in-flight requests finish within this after SIGTERM


def _balance(text: str) -> float | None | str:
    if text.strip().lower() == "off":
        return None
    if text == "default":  # the per-policy default (policies.CACHE_BALANCE)
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a number >= 0 or 'off', not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 or 'off', got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged_router",
                                description="prefix-cache-aware router over engine replicas")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--backends", help="comma-separated engine URLs, e.g. "
                     "http://127.0.0.2:8000,http://127.0.0.3:8000")
    src.add_argument("--discover", metavar="SERVICE",
                     help="watch the EndpointSlices of this Kubernetes Service; ready pods "
                          "join, others leave")
    p.add_argument("--namespace", default=None,
                   help="namespace of --discover (default: the pod's own, else 'default')")
    p.add_argument("--port-name", default=None,
                   help="EndpointSlice port to use (default: the first)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    p.add_argument("--policy", choices=POLICIES, default="prefix")
    p.add_argument("--load-factor", type=float, default=0.25,
                   help="prefix policy: a new prefix skips a backend at (1+this) x mean "
                        "in-flight requests or more")
    p.add_argument("--hit-load-factor", type=float, default=None,
                   help="prefix and precise policies: the same bound for a backend that "
                        "already holds the request's prefix or session (looser: a cached "
                        "prefix is cheap; default: 1.0 for prefix; for precise 2.0 with four "
                        "backends or more, else 1.0)")
    p.add_argument("--cache-balance", type=_balance, default="default", metavar="EPS|off",
                   help="prefix and precise policies: a new prefix skips a backend whose cache "
                        "footprint is above (1+EPS) x the mean (prefix: the chunks the router "
                        "sent each backend; precise: the blocks each holds plus those it lost "
                        "recently); 'off' places new prefixes by the hash ring alone "
                        "(default: 0.25 for prefix, 0 for precise)")
    p.add_argument("--chunk-chars", type=int, default=128,
                   help="prefix policy: characters per hashed chunk")
    p.add_argument("--max-chunks", type=int, default=256,
                   help="prefix policy: chunks hashed per request at most")
    p.add_argument("--table-size", type=int, default=200_000,
                   help="prefix policy: chunk hashes remembered (LRU)")
    p.add_argument("--tokenizer", default=None,
                   help="prefix policy: hash token blocks with this tokenizer.json (or model "
                        "directory) instead of characters; precise policy: by default the "
                        "engines' own (GET /tokenizer of the first that answers); this "
                        "overrides it with the engines' model argument (a directory, "
                        "builtin://NAME or a hub id: its tokenizer files only)")
    p.add_argument("--hash-block-size", type=int, default=16,
                   help="tokens per hashed block with --tokenizer (the engine's --block-size; "
                        "the precise policy takes the engines' own from GET /kv_events)")
    p.add_argument("--kv-events-endpoints", default=None, metavar="PUB[|REPLAY],...",
                   help="precise policy: each backend's KV-event endpoints, in --backends "
                        "order (default: asked from each engine's GET /kv_events)")
    p.add_argument("--health-interval", type=float, default=1.0,
                   help="seconds between /health probes (and load scrapes) per backend")
    p.add_argument("--connect-timeout", type=float, default=2.0)
    p.add_argument("--cold-start-hold", type=float, default=0.0, metavar="SECONDS",
                   help="with no healthy backend, a request waits up to this long for one "
                        "(a service scaled to zero starting its first replica) instead of "
                        "a 503 at once; 0 (default): no wait")
    p.add_argument("--cold-start-queue", type=int, default=64, metavar="N",
                   help="at most N requests wait at once (--cold-start-hold); beyond it a 503 "
                        "with Retry-After")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (env VLLM_API_KEY); "
                        "the header is forwarded to the engines")
    p.add_argument("--api-key-file", default=None,
                   help="read the API key from this file (whitespace stripped), so it never "
                        "appears in argv; overrides --api-key")
    p.add_argument("--log-decisions", action="store_true",
                   help="log every placement as one JSON line (logger "
                        "paged_router.decisions): the backends' scores, in-flight counts, "
                        "the bounds, the pick and the decision")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    return p


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from paged_router.app import RouterConfig, build_app

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe otherwise
    if args.log_decisions:
        logging.getLogger("paged_router.decisions").setLevel(logging.DEBUG)
    for name, value in (("--chunk-chars", args.chunk_chars), ("--max-chunks", args.max_chunks),
                        ("--table-size", args.table_size),
                        ("--hash-block-size", args.hash_block_size)):
        if value < 1:
            raise SystemExit(f"{name} must be >= 1, got {value}")
    if args.health_interval <= 0 or args.connect_timeout <= 0:
        raise SystemExit("--health-interval and --connect-timeout must be > 0")
    if args.cold_start_hold < 0 or args.cold_start_queue < 1:
        raise SystemExit("--cold-start-hold must be >= 0 (seconds) and --cold-start-queue >= 1")
    if args.api_key_file:
        try:
            args.api_key = Path(args.api_key_file).read_text().strip()
        except OSError as exc:
            raise SystemExit(f"--api-key-file {args.api_key_file}: {exc.strerror}") from None
        if not args.api_key:
            raise SystemExit(f"--api-key-file {args.api_key_file} is empty")
    backends = [u for u in (args.backends or "").split(",") if u.strip()]
    endpoints: dict[str, tuple[str, str | None]] = {}
    if args.kv_events_endpoints:
        given = args.kv_events_endpoints.split(",")
        if len(given) != len(backends):
            raise SystemExit(f"--kv-events-endpoints lists {len(given)} backends' endpoints; "
                             f"--backends lists {len(backends)}: give one PUB[|REPLAY] each")
        for url, pair in zip(backends, given):
            pub, _, replay = pair.partition("|")
            endpoints[url] = (pub.strip(), replay.strip() or None)
    try:
        config = RouterConfig(
            backends=backends, kv_events_endpoints=endpoints,
            discover=args.discover, namespace=args.namespace, port_name=args.port_name,
            policy=args.policy, load_factor=args.load_factor,
            hit_load_factor=args.hit_load_factor, cache_balance=args.cache_balance,
            chunk_chars=args.chunk_chars,
            max_chunks=args.max_chunks, table_size=args.table_size, tokenizer=args.tokenizer,
            hash_block_size=args.hash_block_size, health_interval=args.health_interval,
            connect_timeout=args.connect_timeout, api_key=args.api_key or None,
            hold_seconds=args.cold_start_hold, max_held=args.cold_start_queue)
        app = build_app(config)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    # httptools: uvicorn's C parser, ~0.3 ms a request less than h11 (scripts/
    # bench_router_latency.py); the event loop is uvloop where installed, else asyncio
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False,
                                           lifespan="on", log_level=args.log_level,
                                           http="httptools",
                                           timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS))
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    sock = listen_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"routing on http://{host}:{port} (policy {args.policy})", flush=True)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
