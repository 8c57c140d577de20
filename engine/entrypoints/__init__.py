"""The HTTP server: `python -m engine serve` (cli), the FastAPI app (api_server), the
engine-loop thread (async_engine), request bodies (protocol), metrics and errors."""
