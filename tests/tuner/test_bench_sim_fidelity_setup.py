"""bench_sim_fidelity's engines: the sweep's CPU profile for the model, and --cpu-memory-gib
naming the memory every engine takes on both sides (the real engine's flag and the
simulator's base settings), in place of the profile's or the engine's default."""
from __future__ import annotations

from benchmarks.bench_sim_fidelity import cpu_setup

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
