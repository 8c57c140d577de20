"""The settings table (api/paged_api/settings.py): torch-free, the operator image's file set
imports it, and its rules."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from paged_api import settings
from engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]


def test_import_the_settings_table_imports_neither_torch_nor_the_engine():
    code = ("import sys, paged_api.settings; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('engine', 'paged_api', 'tuner', 'loadtests', 'paged_operator')); "
            "assert loaded == ['paged_api', 'paged_api.settings', "
            "'paged_api.settings_speculative', 'paged_api.settings_types'], loaded; "
            "from engine import EngineConfig, SamplingParams; print(EngineConfig.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "EngineConfig"


def test_public_names_still_import_from_engine():
    import engine
    from engine import LLM, LLMEngine, SamplingParams
    assert LLM.__module__ == "engine.llm" and LLMEngine.__name__ == "LLMEngine"
    assert SamplingParams is engine.SamplingParams
    assert set(engine.__all__) <= set(dir(engine))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        engine.nope  # noqa: B018


def _operator_image_files(tmp: Path) -> Path:
    """The files docker/operator.Dockerfile copies into /app, copied under tmp."""
    app = tmp / "app"
    for line in (ROOT / "docker" / "operator.Dockerfile").read_text().splitlines():
        parts = line.split()
        if not parts or parts[0] != "COPY" or any(p.startswith("--") for p in parts):
            continue
        *sources, dest = parts[1:]
        target = app / dest.removeprefix("/app/").rstrip("/")
        for src in sources:
            path = ROOT / src
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                (target if dest.endswith("/") else target.parent).mkdir(parents=True,
                                                                        exist_ok=True)
                shutil.copy(path, target / path.name if dest.endswith("/") else target)
    return app


def test_the_operator_image_file_set_parses_specs_without_torch(tmp_path):
    """Only what the operator Dockerfile copies (paged_operator and the API package): the
    service spec parser and the tuning contract run, no engine, tuner or load-test module
    is there, and torch, optuna, locust stay out."""
    app = _operator_image_files(tmp_path)
    assert sorted(p.name for p in app.iterdir()) == ["paged_api", "paged_operator"]
    code = ("import sys, paged_api.service as s, paged_api.contract as c; "
            f"assert c.__file__.startswith({str(app)!r}), c.__file__; "
            "assert not {'engine', 'tuner', 'loadtests'} & set(sys.modules); "
            "spec = s.parse_spec({'model': {'uri': 'a/b'}, 'engine': {'blockSize': 32}}, "
            "name='x', namespace='d'); print(spec.engine.flags()[:2]); "
            "t = c.parse_tuning({'targetRef': {'name': 'svc'}, 'workload': 'rag'}); "
            "print(t.workload, sorted(p.name for p in t.space)); "
            "print(c.spec_error({'targetRef': {'name': 'svc'}, 'workload': 'nope'})); "
            "assert not {'torch', 'optuna', 'locust'} & set(sys.modules), sorted(sys.modules)")
    # -S, then this interpreter's site-packages without their .pth files: the editable
    # install's finder would otherwise resolve engine.* submodules from the checkout. The
    # paths come from this process: under -S a venv's python does not know it is one.
    paths = sysconfig.get_paths()
    site_packages = list(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    boot = (f"import sys; sys.path[:0] = [{str(app)!r}]; "
            f"sys.path += {site_packages!r}; exec({code!r})")
    out = subprocess.run([sys.executable, "-S", "-c", boot], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "['--block-size', '32']",
        "rag ['block_size', 'gpu_memory_utilization', 'max_num_batched_tokens', 'max_num_seqs', "
        "'num_speculative_tokens']",
        "spec.workload: 'nope' is not one of chat, summarize, code, rag, mixed, agentic"]


@pytest.mark.parametrize("name, value, rule", [
    ("block_size", 3, "a power of two in 1..256"),
    ("block_size", 512, "a power of two in 1..256"),
    ("block_size", True, "a power of two in 1..256"),          # bool is not an int here
    ("gpu_memory_utilization", 0.0, r"a number in \(0, 1\]"),
    ("gpu_memory_utilization", float("nan"), r"a number in \(0, 1\]"),
    ("max_model_len", 1, r"a whole number >= 2 \(or unset\)"),
    ("max_num_seqs", 1.0, "a whole number >= 1"),
    ("dtype", "int8", "one of auto, float32, float16, bfloat16, half, float"),
    ("attention_backend", "cuda", r"one of torch, triton \(or unset\)"),
    ("cpu_memory_gib", 0, "a number > 0"),
])
def test_one_message_format_names_the_setting_and_its_rule(name, value, rule):
    with pytest.raises(ValueError, match=f"^{name} must be {rule}, got {re.escape(repr(value))}$"):
        settings.check(name, value)
    with pytest.raises(ValueError, match=f"^{name} must be {rule}, got"):
        EngineConfig(**{name: value})


def test_valid_values_pass_and_ints_become_floats():
    assert settings.check("gpu_memory_utilization", 1) == 1.0
    assert isinstance(EngineConfig(gpu_memory_utilization=1).gpu_memory_utilization, float)
    assert EngineConfig(model=Path("/m")).model == "/m"
    assert settings.check("max_model_len", None) is None
    assert settings.parse_text("enable_prefix_caching", "false") is False


@pytest.mark.parametrize("values, message", [
    ({"max_num_seqs": 64, "max_num_batched_tokens": 32},
     r"max_num_batched_tokens \(32\) must be >= max_num_seqs \(64\)"),
    ({"max_num_batched_tokens": 100}, r"max_num_batched_tokens \(100\) must be >= "
                                      r"max_num_seqs \(256\)"),     # the default applies
    ({"max_num_seqs": 4096}, r"\(2048\) must be >= max_num_seqs \(4096\)"),
])
def test_engine_config_owns_the_batched_tokens_rule(values, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**values)
    EngineConfig(max_num_seqs=64, max_num_batched_tokens=64)


def test_env_is_read_by_one_reader_with_the_same_message(monkeypatch):
    monkeypatch.setenv("PAGED_CPU_MEMORY_GIB", "lots")
    with pytest.raises(ValueError, match="^PAGED_CPU_MEMORY_GIB must be a number > 0, "
                                         "got 'lots'$"):
        EngineConfig()
    monkeypatch.setenv("PAGED_CPU_MEMORY_GIB", "-1")
    with pytest.raises(ValueError, match="^PAGED_CPU_MEMORY_GIB must be a number > 0"):
        EngineConfig()
    monkeypatch.setenv("PAGED_CPU_MEMORY_GIB", "")   # empty: unset
    monkeypatch.setenv("PAGED_CPU_THREADS", "2")
    config = EngineConfig()
    assert (config.cpu_memory_gib, config.cpu_threads) == (2.0, 2)
