"""`python -m engine serve [MODEL]`: vLLM's flag names, then uvicorn on a socket we bind.

Binding the socket here (rather than inside uvicorn) lets `--port 0` pick a free port
and print it, which is how tests and the tuner find a server they started.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

from paged_api import settings as engine_settings
from engine.entrypoints.api_server import ServerSettings, build_app
from engine.entrypoints.tool_calls import TOOL_CALL_PARSERS
from engine.listen import listen_socket

logger = logging.getLogger("engine.server")

# Flags that map 1:1 onto LLMEngine.from_args keyword arguments (None: engine default):
# every setting of api/paged_api/settings.py that has a flag, MODEL/--model aside.
ENGINE_FLAGS = tuple(s.name for s in engine_settings.TABLE
                     if s.flag is not None and s.name != "model")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _setting_type(s: engine_settings.Setting) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return engine_settings.parse_text(s, text, "")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).lstrip()) from None  # argparse names the flag
    convert.__name__ = s.type.__name__
    return convert


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting of the table that has one, MODEL aside (unset: None, so the
    engine's default applies; an env-backed default is read here)."""
    for s in engine_settings.TABLE:
        if s.flag is None or s.name == "model":
            continue
        help_text = s.help if s.default is None else \
            f"{s.help} (default: {engine_settings.show(s.default)})"
        if s.env:
            help_text += f"; env {s.env}"
        if s.type is bool:
            parser.add_argument(s.flag, dest=s.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
            continue
        try:
            default = engine_settings.env_value(s)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
        parser.add_argument(s.flag, dest=s.name, type=_setting_type(s), default=default,
                            help=help_text + f"; {s.rule}",
                            metavar="{" + ",".join(s.choices) + "}" if s.choices
                            else s.name.upper())


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="local Hugging Face checkpoint directory, or builtin://default (the "
                        "embedded tiny model, the default) or builtin://smollm2-135m-instruct")
    p.add_argument("--model", dest="model_flag", default=None, help="same as MODEL")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    # The engine's settings, from the table (flags, types, bounds, env defaults).
    add_setting_arguments(p)
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize and "
                        "/detokenize (env VLLM_API_KEY)")
    p.add_argument("--api-key-file", default=None,
                   help="read the API key from this file (surrounding whitespace stripped), "
                        "so it never appears in argv; overrides --api-key")
    p.add_argument("--max-waiting-requests", type=int, default=512,
                   help="requests admitted beyond --max-num-seqs before new ones get 503 "
                        "with Retry-After")
    p.add_argument("--max-request-body-bytes", type=_positive_int, default=8 * 1024 * 1024)
    p.add_argument("--max-prompt-bytes", type=_positive_int, default=2 * 1024 * 1024,
                   help="prompt or messages text larger than this (UTF-8 bytes) gets 413 "
                        "before it is tokenized")
    p.add_argument("--max-stream-backlog-tokens", type=_positive_int, default=16384,
                   help="a request whose client leaves more generated tokens than this "
                        "unread is aborted (its stream ends with an error event)")
    p.add_argument("--limit-concurrency", type=_positive_int, default=2048,
                   help="open connections (and requests) beyond which new ones get 503")
    p.add_argument("--header-read-timeout", type=float, default=10.0,
                   help="seconds a connection may take to send a request's headers before "
                        "it is closed")
    p.add_argument("--shutdown-grace-period", type=float, default=30.0,
                   help="seconds in-flight requests may run after SIGTERM before being aborted")
    p.add_argument("--access-log-prompts", action="store_true",
                   help="include prompt text in access-log lines (off: never logged)")
    p.add_argument("--request-log", default=None, metavar="FILE",
                   help="append one JSON line per request to FILE: arrival time, prompt and "
                        "output token counts, finish reason and prefix hashes (no text); "
                        "`python -m tuner trace FILE` turns it into a replayable trace")
    p.add_argument("--request-log-prefix-tokens", type=_positive_int, default=32, metavar="N",
                   help="the request log's prefix group is a hash of the first N prompt tokens "
                        "(deeper hashes at 2N, 4N, ...)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template file used instead of the tokenizer's (e.g. "
                        "examples/tool_chat_template_smollm2_hermes.jinja for tools)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let tool_choice "auto" parse calls out of the model\'s text '
                        "(needs --tool-call-parser)")
    p.add_argument("--tool-call-parser", default=None, choices=list(TOOL_CALL_PARSERS),
                   help="how calls are written in the model's text: hermes = "
                        "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if args.model and args.model_flag and args.model != args.model_flag:
        raise SystemExit(f"MODEL ({args.model}) and --model ({args.model_flag}) disagree; "
                         "give one")
    kwargs = {name: getattr(args, name) for name in ENGINE_FLAGS
              if getattr(args, name) is not None}
    kwargs["model"] = args.model or args.model_flag
    try:  # cross-setting rules, unset flags taking the engine's defaults
        engine_settings.check_rules(kwargs, lambda s: s.flag or s.name)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    return kwargs


def server_settings(args: argparse.Namespace) -> ServerSettings:
    if args.max_waiting_requests < 0:
        raise SystemExit("--max-waiting-requests must be >= 0")
    if args.shutdown_grace_period < 0:
        raise SystemExit("--shutdown-grace-period must be >= 0")
    if not args.header_read_timeout > 0:
        raise SystemExit("--header-read-timeout must be > 0")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise SystemExit("--enable-auto-tool-choice needs --tool-call-parser (hermes)")
    return ServerSettings(api_key=_api_key(args),
                          chat_template=_chat_template(args.chat_template),
                          enable_auto_tool_choice=args.enable_auto_tool_choice,
                          tool_call_parser=args.tool_call_parser,
                          max_waiting_requests=args.max_waiting_requests,
                          max_request_body_bytes=args.max_request_body_bytes,
                          max_prompt_bytes=args.max_prompt_bytes,
                          max_stream_backlog_tokens=args.max_stream_backlog_tokens,
                          shutdown_grace_period=args.shutdown_grace_period,
                          access_log_prompts=args.access_log_prompts,
                          request_log=_request_log_path(args.request_log),
                          request_log_prefix_tokens=args.request_log_prefix_tokens)


def _chat_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SystemExit(f"--chat-template {path}: {exc.strerror or exc}") from None


def _request_log_path(path: str | None) -> str | None:
    """--request-log, checked before the model loads: its folder must exist."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SystemExit(f"--request-log {path}: {folder} is not a writable folder; create it "
                         "or choose another path")
    return path


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file is None:
        return args.api_key or None
    try:
        with open(args.api_key_file, encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as exc:
        raise SystemExit(f"--api-key-file: cannot read {args.api_key_file}: "
                         f"{exc.strerror}") from None
    if not key:
        raise SystemExit(f"--api-key-file: {args.api_key_file} is empty")
    return key


def bind_socket(host: str, port: int) -> socket.socket:
    return listen_socket(host, port)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from engine import LLMEngine
    from engine.entrypoints.http_server import Server, header_timeout_protocol

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kwargs, settings = engine_kwargs(args), server_settings(args)
    server: Server | None = None

    def stop() -> None:
        assert server is not None
        server.should_exit = True

    app = build_app(engine_factory=lambda: LLMEngine.from_args(**kwargs), settings=settings,
                    on_fatal=stop)
    # The app ends open requests itself when the grace period is over (error event and
    # [DONE]); uvicorn's own deadline, a little later, is only the backstop.
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=settings.shutdown_grace_period + 5,
                            limit_concurrency=args.limit_concurrency,
                            http=header_timeout_protocol(args.header_read_timeout),
                            log_level=args.log_level)
    state = app.state.server
    server = Server(config, on_shutdown=lambda: state.begin_shutdown(
        settings.shutdown_grace_period))
    # SIGTERM before uvicorn installs its own handler asks for the same clean stop. After
    # its shutdown uvicorn re-raises the signal it caught; with the default handler that
    # would end a graceful drain with -SIGTERM instead of exit status 0.
    signal.signal(signal.SIGTERM, lambda *_: stop())
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"serving on http://{host}:{port}", flush=True)
    server.run(sockets=[sock])
    if state.loader is not None and state.loader.is_alive():
        # Stopped while the model was still loading: nothing was served, and letting the
        # interpreter tear down under a thread inside torch aborts the process.
        logger.info("stopped during model loading; exiting")
        logging.shutdown()
        os._exit(0)
    if state.load_error is not None:
        logger.error("exiting: the model failed to load: %s", state.load_error)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    # No prefix matching (allow_abbrev=False): `--hos` or `--block 1` must not pass a filter
    # of flag names (the operator's extraArgs) and then take effect as --host / --block-size.
    parser = argparse.ArgumentParser(prog="python -m engine", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server",
                                  allow_abbrev=False)
    add_serve_arguments(serve_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
