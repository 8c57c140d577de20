"""The simulated KV pools sized from the pilot's (capacity_profile.fit_pool): checked against
the real engine's own pool in fresh processes, on a GPU profile, with a calibrated
activation slope, and with the sequences' logits the engine's profiling forward keeps."""
from __future__ import annotations

import dataclasses
import json

import pytest

import tuner.search.capacity_sweep as cs
from tuner.incluster import capacity_job
from tuner.sim.calibrate import config_profile
from tuner.sim.context import SimContext
from tuner.sim.profile import Fit

from test_tuner_cluster_capacity import CPU_TARGET


POOL = """
import json, sys
from engine import LLMEngine
e = LLMEngine.from_args(model="builtin://default", max_model_len=1024, cpu_memory_gib=4.0,
                        block_size=int(sys.argv[1]), gpu_memory_utilization=float(sys.argv[2]))
print(json.dumps([e.info.num_blocks, e.info.kv_bytes_per_block,
                  e.runner.config.max_num_batched_tokens]))
"""


def _real_pool(block: int, fraction: float) -> tuple[int, int, int]:
    """(blocks, KV bytes per block, max_num_batched_tokens) of a real engine in a fresh
    process, as each trial service is (a process's first forward sizes its activations)."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", POOL, str(block), str(fraction)],
                         capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_pilots_pool_sizes_the_simulated_pools_as_the_engine_does():
    """The oracle is the engine's own pool at other block sizes and fractions (4 GiB of
    CPU memory): a profile from config.json, in the engine's dtype (float32 on a CPU),
    fitted to one real pool, gives the others to within 5 % (the engine measures its
    activations from the process's resident memory, which moved by up to 40 MB between
    two runs of the same settings here)."""
    target = {**CPU_TARGET, "env": [{"name": "PAGED_CPU_MEMORY_GIB", "value": "4"}]}
    profile = capacity_job.model_memory(config_profile("builtin://default", 1), target)
    blocks, block_bytes, _ = _real_pool(16, 0.5)
    assert profile.memory.kv_bytes_per_token * 16 == block_bytes
    base = capacity_job.simulator_base(target)
    assert base["cpu_memory_gib"] == 4.0
    plan = cs.CapacityPlan(sim=SimContext(profile, {}), sim_base=base, log=lambda s: None)
    cs.fit_pool(plan, blocks, {**base, "block_size": 16, "gpu_memory_utilization": 0.5})
    memory = plan.sim.profile.memory
    for block, fraction in ((32, 0.5), (8, 0.3)):
        real, _, tokens = _real_pool(block, fraction)
        predicted = memory.num_blocks(block_size=block, fraction=fraction,
                                      max_num_batched_tokens=tokens, max_num_seqs=256,
                                      cpu_memory_gib=4.0)
        assert predicted == pytest.approx(real, rel=0.05), (block, fraction)
    # the plain config.json profile (2-byte KV, no weights) would be far off
    plain = config_profile("builtin://default", 1).memory
    assert plain.num_blocks(block_size=8, fraction=0.3, max_num_batched_tokens=2048,
                            max_num_seqs=256, cpu_memory_gib=4.0) > 1.5 * real


def test_on_a_gpu_the_device_is_what_holds_the_weights_and_the_pilots_pool():
    profile = config_profile("builtin://default", 1)
    profile = dataclasses.replace(profile, memory=dataclasses.replace(
        profile.memory, weight_bytes=3e9))
    plan = cs.CapacityPlan(sim=SimContext(profile, {}), sim_base={}, log=lambda s: None)
    cs.fit_pool(plan, 1000, {"block_size": 16, "gpu_memory_utilization": 0.8})
    memory = plan.sim.profile.memory
    pool = 1000 * 16 * memory.kv_bytes_per_token
    # the activations of a config.json profile: the default 256 sequences' logits
    logits = 256 * memory.vocab_size * (2 + 4)
    assert memory.activations(max_num_batched_tokens=2048, max_num_seqs=256) == logits
    assert memory.device_bytes == pytest.approx((3e9 + logits + pool) / 0.8)
    assert memory.num_blocks(block_size=16, fraction=0.8, max_num_batched_tokens=2048,
                             max_num_seqs=256, cpu_memory_gib=99) == 1000
    assert memory.num_blocks(block_size=32, fraction=0.8, max_num_batched_tokens=2048,
                             max_num_seqs=256, cpu_memory_gib=99) == 500


def test_a_calibrated_activation_slope_is_kept_and_its_constant_re_anchored():
    """A calibration's memory (weights 100 MB, activations 50 MB + 20 kB per batched
    token) whose pool is not the pilot's: the pilot's 1000 blocks at the defaults (2048
    batched tokens) are reproduced, and a smaller token budget frees the slope's bytes."""
    from tuner.sim.profile import Identity, Memory, Profile

    memory = Memory(0, 100e6, 4096, 50e6, 20e3, 2048, 100)
    profile = Profile(Identity("m", "f", "cpu", "2", 1), Fit("tokens", {}, 0.1), memory, 10)
    plan = cs.CapacityPlan(sim=SimContext(profile, {}), sim_base={}, log=lambda s: None)
    settings = {"block_size": 16, "gpu_memory_utilization": 0.5, "cpu_memory_gib": 1.0}
    cs.fit_pool(plan, 1000, settings)
    fitted = plan.sim.profile.memory
    at = dict(block_size=16, fraction=0.5, max_num_seqs=256, cpu_memory_gib=1.0)
    assert fitted.num_blocks(max_num_batched_tokens=2048, **at) == 1000
    assert fitted.activation_per_token == 20e3 and fitted.weight_bytes == 100e6
    freed = 20e3 * (2048 - 512) // (16 * 4096)
    assert fitted.num_blocks(max_num_batched_tokens=512, **at) in (1000 + freed,
                                                                   1000 + freed + 1)


def test_the_sequences_logits_are_kept_as_a_slope_of_the_pools_activations():
    """The engine's profiling forward keeps the last logits of min(max_num_seqs, budget)
    sequences (SmolLM2: 49,152 x 4 bytes each, 50 MB at the default 256): an engine whose
    activations are 300 MB + 20 kB per batched token + those logits, its pilot at the
    defaults, sizes a setting of 41 sequences and 408 tokens as that engine would;
    without the logits' term the fit would keep the defaults' 50 MB there."""
    from engine.kv_capacity import num_kv_blocks
    from tuner.sim.profile import Identity, Memory, Profile

    per_seq, kv = 49_152 * 4, 46_080
    truth = dict(weight_bytes=540e6, per_token=20e3, base=300e6)

    def real_pool(block, fraction, tokens, seqs):
        act = truth["base"] + truth["per_token"] * tokens + per_seq * min(seqs, tokens)
        return num_kv_blocks(device_bytes=2 * 2**30, fraction=fraction,
                             weight_bytes=truth["weight_bytes"], activation_bytes=act,
                             block_bytes=block * kv)

    # the calibration measured one sequence in a warm process: a far smaller constant
    memory = Memory(0, 540e6, kv, 20e6, 20e3, 8192, 49_152, activation_per_seq=per_seq)
    profile = Profile(Identity("m", "f", "cpu", "2", 1), Fit("tokens", {}, 0.1), memory, 10)
    plan = cs.CapacityPlan(sim=SimContext(profile, {}), sim_base={}, log=lambda s: None)
    cs.fit_pool(plan, real_pool(16, 0.9, 2048, 256),
                {"block_size": 16, "gpu_memory_utilization": 0.9, "cpu_memory_gib": 2.0})
    fitted = plan.sim.profile.memory
    got = fitted.num_blocks(block_size=32, fraction=0.65, max_num_batched_tokens=408,
                            max_num_seqs=41, cpu_memory_gib=2.0)
    assert got == pytest.approx(real_pool(32, 0.65, 408, 41), abs=1)
    # fewer sequences than the budget's tokens: each is one row; a budget below
    # max_num_seqs profiles one sequence per token
    assert fitted.activations(max_num_batched_tokens=64, max_num_seqs=256) - \
        fitted.activations(max_num_batched_tokens=64, max_num_seqs=32) == \
        pytest.approx((64 - 32) * per_seq)
