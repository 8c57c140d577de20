"""A real HTTP /metrics whose step counters grow by a known law while it is read (the
serving loop's paged:engine_step_* series, without an engine)."""
from __future__ import annotations

import contextlib
import random
import threading
import time

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.entrypoints.metrics import ServerMetrics
from engine.step_shape import StepShape

LAW = {"intercept": 0.003, "prefill_tokens": 1e-5, "decode_seqs": 5e-4}


def text_endpoint(answer) -> ThreadingHTTPServer:
    """A real HTTP server, already serving, whose every GET answers `answer()` ->
    (status, body bytes) in Prometheus' text format; shut it down when done."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = answer()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


# the host KV tier's copies fed with `copies`: seconds per byte of stores and loads
COPY_RATES = {"GPU_to_CPU": 4e-10, "CPU_to_GPU": 2.5e-10}
COPY_BYTES_PER_TICK = 64 << 10

# the loop's gap after each step fed with `gaps` (paged:engine_step_gap_seconds)
GAP = 0.001

# speculation (k = 2) fed with `spec`: a draft on DRAFT_SHARE of the decode rows, its
# first token accepted at ACCEPT[0], its second at ACCEPT[1] when the first was
DRAFT_SHARE, ACCEPT = 0.5, (0.8, 0.5)


@contextlib.contextmanager
def feeding_metrics(num_gpu_blocks: int | None = None, *, spec: bool = False,
                    copies: bool = False, gaps: bool = False):
    """Yields the endpoint's base URL; steps are observed every 10 ms meanwhile, their mix
    drifting (as a service's does, so that windows differ). With `num_gpu_blocks` it also
    exports vllm:cache_config_info, as the engine does; with `spec`, the speculative
    decoding counters of two-token drafts at DRAFT_SHARE and ACCEPT (in expectation); with
    `copies`, the host KV tier's copy counters (vllm:kv_offload_total_bytes and _time by
    transfer_type) at COPY_RATES; with `gaps`, a loop gap of GAP after each step."""
    metrics, stop = ServerMetrics(model_name="m", max_model_len=2048), threading.Event()
    if copies:
        from prometheus_client import Counter
        labels = ("model_name", "transfer_type")
        moved = Counter("vllm:kv_offload_total_bytes", "", labels, registry=metrics.registry)
        took = Counter("vllm:kv_offload_total_time", "", labels, registry=metrics.registry)
    if num_gpu_blocks is not None:
        metrics.set_cache_config(block_size=16, num_gpu_blocks=num_gpu_blocks,
                                 enable_prefix_caching=True, gpu_memory_utilization=0.9)

    def serve():
        # the mix drifts with the wall clock, not the loop count: a loaded machine runs
        # fewer loops per window, and windows must still differ in their prefill share
        # (with a fast drift every window averaged the same, and the prefill coefficient
        # came out 20 % low under CI's load)
        rng, start = random.Random(0), time.monotonic()
        while not stop.wait(0.01):
            t = time.monotonic() - start
            rows, prompt = 1 + int(t / 0.37) % 32, [0, 64, 300][int(t / 0.9) % 3]
            for _ in range(rng.randint(1, 6)):
                shape = StepShape(prefill_tokens=rng.choice([0, prompt]),
                                  decode_seqs=rng.randint(max(1, rows - 4), rows))
                metrics.observe_step(shape, LAW["intercept"]
                                     + LAW["prefill_tokens"] * shape.prefill_tokens
                                     + LAW["decode_seqs"] * shape.decode_seqs)
                if gaps:
                    metrics.step_gap.observe(GAP)
                if spec:
                    drafts = DRAFT_SHARE * shape.decode_seqs
                    metrics.spec_decode_num_drafts.inc(drafts)
                    metrics.spec_decode_num_draft_tokens.inc(2 * drafts)
                    first = drafts * ACCEPT[0]
                    metrics.spec_decode_num_accepted_tokens.inc(first * (1 + ACCEPT[1]))
                    for pos, value in enumerate((first, first * ACCEPT[1])):
                        metrics._spec_per_pos.labels("m", str(pos)).inc(value)
            for kind, rate in COPY_RATES.items() if copies else ():
                moved.labels("m", kind).inc(COPY_BYTES_PER_TICK)
                took.labels("m", kind).inc(COPY_BYTES_PER_TICK * rate)

    httpd = text_endpoint(lambda: (200, generate_latest(metrics.registry)))
    feeder = threading.Thread(target=serve, daemon=True)
    feeder.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        stop.set()
        feeder.join()
        httpd.shutdown()
        httpd.server_close()


def assert_recovers_the_law(coefficients: dict, *, gap: float = 0.0) -> None:
    """The fit is LAW, its intercept with `gap` (the loop's gap after each step) added."""
    # (a reading may catch a step half counted: a little noise per window)
    for name, value in {**LAW, "intercept": LAW["intercept"] + gap}.items():
        assert abs(coefficients.get(name, 0.0) - value) <= 0.1 * value, (name, coefficients)
