"""`python -m engine serve` flags: vLLM's names map onto the engine's keyword arguments."""
from __future__ import annotations

import argparse

import pytest

from engine.entrypoints.cli import (add_serve_arguments, build_parser, engine_kwargs,
                                    server_settings)
from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.xdist_group("server")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def test_vllm_flag_names_become_engine_kwargs(monkeypatch):
    args = parse("/models/llama", "--block-size", "32", "--gpu-memory-utilization", "0.8",
                 "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",
                 "--max-model-len", "1024", "--no-enable-prefix-caching",
                 "--num-gpu-blocks-override", "100", "--seed", "3", "--dtype", "float32",
                 "--served-model-name", "llama", "--cpu-memory-gib", "4",
                 "--scheduling-policy", "priority", "--cpu-threads", "3")
    assert engine_kwargs(args) == {
        "model": "/models/llama", "block_size": 32, "gpu_memory_utilization": 0.8,
        "max_num_seqs": 64, "max_num_batched_tokens": 4096, "max_model_len": 1024,
        "enable_prefix_caching": False, "num_gpu_blocks_override": 100, "seed": 3,
        "dtype": "float32", "served_model_name": "llama", "cpu_memory_gib": 4.0,
        "scheduling_policy": "priority", "cpu_threads": 3}
    assert engine_kwargs(parse("--enable-prefix-caching"))["enable_prefix_caching"] is True


def test_unset_flags_leave_engine_defaults_and_env_fills_memory(monkeypatch):
    monkeypatch.delenv("PAGED_CPU_MEMORY_GIB", raising=False)
    monkeypatch.delenv("PAGED_CPU_THREADS", raising=False)
    assert engine_kwargs(parse()) == {"model": None}
    monkeypatch.setenv("PAGED_CPU_MEMORY_GIB", "1.5")
    monkeypatch.setenv("PAGED_CPU_THREADS", "2")
    assert engine_kwargs(parse())["cpu_memory_gib"] == 1.5
    assert engine_kwargs(parse())["cpu_threads"] == 2
    args = parse()
    assert args.port == 8000 and args.host == "0.0.0.0"


def test_server_settings_and_bad_values(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    s = server_settings(parse("--max-waiting-requests", "7", "--shutdown-grace-period", "2",
                              "--access-log-prompts"))
    assert (s.api_key, s.max_waiting_requests, s.shutdown_grace_period,
            s.access_log_prompts) == ("from-env", 7, 2.0, True)
    with pytest.raises(SystemExit):
        parse("--max-num-seqs", "0")
    with pytest.raises(SystemExit, match="max-waiting-requests"):
        server_settings(parse("--max-waiting-requests", "-1"))
    with pytest.raises(SystemExit):
        parse("--cpu-threads", "0")
    monkeypatch.setenv("PAGED_CPU_THREADS", "many")
    with pytest.raises(SystemExit, match="PAGED_CPU_THREADS must be a whole number >= 1 "
                                         r"\(or unset\), got 'many'"):
        parse()
    monkeypatch.delenv("PAGED_CPU_THREADS")
    with pytest.raises(SystemExit, match="disagree"):
        engine_kwargs(parse("a", "--model", "b"))


@pytest.mark.parametrize("argv", [["--hos", "0.0.0.0"], ["--por=1"], ["--block", "1"],
                                  ["--served-model", "x"], ["--max-model", "99"]])
def test_flag_prefixes_are_rejected(argv, capsys):
    """A filter of flag names (the operator's extraArgs) must see what takes effect:
    argparse's prefix matching would turn `--hos` into --host."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", *argv])
    assert "unrecognized arguments" in capsys.readouterr().err
    full = build_parser().parse_args(["serve", "--host", "0.0.0.0", "--port=1",
                                      "--block-size", "16"])
    assert (full.host, full.port, full.block_size) == ("0.0.0.0", 1, 16)


def test_chat_template_and_tool_flags(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0].content }}")
    s = server_settings(parse("--chat-template", str(template), "--enable-auto-tool-choice",
                              "--tool-call-parser", "hermes"))
    assert (s.chat_template, s.enable_auto_tool_choice, s.tool_call_parser) == (
        "{{ messages[0].content }}", True, "hermes")
    assert server_settings(parse()).chat_template is None
    with pytest.raises(SystemExit, match="--tool-call-parser"):
        server_settings(parse("--enable-auto-tool-choice"))
    with pytest.raises(SystemExit, match="--chat-template"):
        server_settings(parse("--chat-template", str(tmp_path / "missing.jinja")))
    with pytest.raises(SystemExit):
        parse("--tool-call-parser", "mistral")  # not one we parse


def test_api_key_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert server_settings(parse("--api-key-file", str(key_file))).api_key == "from-file"
    assert server_settings(parse()).api_key == "from-env"
    with pytest.raises(SystemExit, match="cannot read"):
        server_settings(parse("--api-key-file", str(tmp_path / "missing")))
    key_file.write_text("  \n")
    with pytest.raises(SystemExit, match="is empty"):
        server_settings(parse("--api-key-file", str(key_file)))


def test_probes_while_loading(server):
    """vLLM's semantics: /health (and its alias /ready) is 503 until the server can serve;
    the liveness path /livez answers while the model loads; the API waits."""
    assert server.during_load == {"health": 503, "ready": 503, "livez": 200,
                                  "completions": 503}


def test_sigterm_during_loading_exits_0():
    proc = ServerProcess("--num-gpu-blocks-override", "200", wait_ready=False)
    assert proc.stop() == 0, proc.log


def test_a_model_that_cannot_load_exits_1_and_says_why(tmp_path):
    proc = ServerProcess(str(tmp_path / "missing"), wait_ready=False)
    assert proc.proc.wait(120) == 1
    assert "does not exist" in proc.log
