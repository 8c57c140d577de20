"""bench_sim_fidelity's engines: the sweep's CPU profile for the model, and --cpu-memory-gib
naming the memory every engine takes on both sides (the real engine's flag and the
simulator's base settings), in place of the profile's or the engine's default; the
latencies' window long enough for --latency-requests arrivals; the hit rates' report."""
from __future__ import annotations

import pytest

from benchmarks.bench_sim_fidelity import cpu_setup
from benchmarks.sim_fidelity_grids import hit_rate_lines, latency_window

SMOLLM2 = "builtin://smollm2-135m-instruct"


def _flag(launch, name):
    flags = list(launch.extra_flags)
    return flags[flags.index(name) + 1] if name in flags else None


def test_the_memory_named_reaches_the_real_engine_and_the_simulator():
    default = cpu_setup("summarize", SMOLLM2)
    assert default.base == {} and _flag(default.launch, "--cpu-memory-gib") is None
    assert _flag(default.launch, "--cpu-threads") == "1"   # SmolLM2's profile, kept
    named = cpu_setup("summarize", SMOLLM2, 4.0)
    assert named.base == {"cpu_memory_gib": 4.0}
    assert float(_flag(named.launch, "--cpu-memory-gib")) == 4.0
    assert _flag(named.launch, "--cpu-threads") == "1"
    assert (named.slos, named.users, named.scale) == (default.slos, default.users,
                                                      default.scale)


def test_the_embedded_models_own_memory_is_replaced_not_doubled():
    tiny = cpu_setup("chat", None)
    assert tiny.base == {"cpu_memory_gib": 0.5}
    more = cpu_setup("chat", None, 1.0)
    assert more.base == {"cpu_memory_gib": 1.0}
    assert list(more.launch.extra_flags).count("--cpu-memory-gib") == 1
    assert float(_flag(more.launch, "--cpu-memory-gib")) == 1.0


def test_the_latency_window_holds_the_requests_asked_for_at_a_slow_rate():
    # SmolLM2's summarize at 0.43 req/s: 20 s drew 5 arrivals; 40 need ~93 s
    assert latency_window(20.0, 0.43, 40) == pytest.approx(40 / 0.43)
    assert latency_window(20.0, 0.43, 40) * 0.43 == pytest.approx(40)
    # the embedded model at 6 req/s: 8 s already hold 48, the window stays 8 s
    assert latency_window(8.0, 6.0, 40) == 8.0
    assert latency_window(8.0, 5.0, 40) == 8.0     # exactly 40: --duration kept
    assert latency_window(8.0, 4.9, 40) > 8.0
    assert latency_window(8.0, 0.43, 0) == 8.0     # 0: --duration alone
    with pytest.raises(ValueError, match="rate must be above 0"):
        latency_window(8.0, 0.0, 40)


def test_the_hit_rates_are_compared_only_where_both_sides_have_them():
    rows = [{"p_prefix_cache_hit_rate": 0.50, "real_prefix_cache_hit_rate": 0.40,
             "p_host_tier_hit_rate": None, "real_host_tier_hit_rate": 0.1},
            {"p_prefix_cache_hit_rate": 0.90, "real_prefix_cache_hit_rate": 0.96,
             "p_host_tier_hit_rate": 0.3, "real_host_tier_hit_rate": None},
            {"p_prefix_cache_hit_rate": 0.20, "real_prefix_cache_hit_rate": 0.50}]
    lines = hit_rate_lines(rows, "p")
    assert len(lines) == 1   # no pair for the host tier, none for the disk tier
    assert lines[0].startswith("prefix_cache_hit_rate: median |simulated - real| 0.100 "
                               "over 3 settings")
    assert "0.50/0.40, 0.90/0.96, 0.20/0.50" in lines[0]
