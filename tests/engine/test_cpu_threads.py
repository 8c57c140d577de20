"""`cpu_threads` (flag `--cpu-threads`, env PAGED_CPU_THREADS) sets torch's intra-op threads on CPU."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = textwrap.dedent("""
    import sys, torch
    from engine import LLM, SamplingParams
    before = torch.get_num_threads()
    kwargs = {} if sys.argv[2] == "default" else {"cpu_threads": int(sys.argv[2])}
    llm = LLM(model=sys.argv[1], num_gpu_blocks_override=32, max_model_len=128, **kwargs)
    out = llm.generate(["hello there"], SamplingParams(max_tokens=3, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 3
    print(before, torch.get_num_threads())
""")


def _threads(checkpoint: str, setting: str, env_threads: str) -> tuple[int, int]:
    env = {"PATH": "", "OMP_NUM_THREADS": env_threads, "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", _PROBE, checkpoint, setting], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = map(int, done.stdout.split()[-2:])
    return before, after


def test_cpu_threads_sets_torch_threads_and_the_default_leaves_them(tiny_checkpoints):
    # OMP_NUM_THREADS=1 makes torch's own default 1, so 3 can only come from the setting.
    assert _threads(tiny_checkpoints["llama"], "3", "1") == (1, 3)
    assert _threads(tiny_checkpoints["llama"], "default", "1") == (1, 1)
