"""The engine command the operator writes into pods parses with the engine's real CLI."""
from __future__ import annotations

import argparse

import pytest

from paged_operator import manifests
from paged_operator.spec import parse_spec


@pytest.mark.parametrize("engine, expected", [
    ({}, {"block_size": 16, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True}),
    ({"blockSize": 32, "gpuMemoryUtilization": 0.5, "maxNumSeqs": 8, "maxNumBatchedTokens": 512,
      "maxModelLen": 2048, "enablePrefixCaching": False, "extraArgs": ["--seed", "3"]},
     {"block_size": 32, "gpu_memory_utilization": 0.5, "max_num_seqs": 8,
      "max_num_batched_tokens": 512, "max_model_len": 2048, "enable_prefix_caching": False,
      "seed": 3}),
])
def test_operator_args_parse_with_the_engine_cli(engine, expected):
    from engine.entrypoints.cli import add_serve_arguments, engine_kwargs

    spec = parse_spec({"model": {"uri": "pvc://models/qwen", "servedName": "chat"},
                       "engine": engine}, name="svc", namespace="default")
    container = manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "engine", "serve"]
    parser = argparse.ArgumentParser(prog="python -m engine serve")
    add_serve_arguments(parser)
    args = parser.parse_args(container["args"])
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    kwargs = engine_kwargs(args)
    assert kwargs["model"] == "/mnt/model/qwen" and kwargs["served_model_name"] == "chat"
    assert {k: kwargs[k] for k in expected} == expected


@pytest.mark.parametrize("resources, env, threads", [
    ({"gpus": 0, "cpu": "3500m"}, [], "3"),       # CPU engine: one thread per requested core
    ({"gpus": 0, "cpu": "500m"}, [], "1"),        # at least one
    ({"gpus": 0, "cpu": "8"}, [{"name": "PAGED_CPU_THREADS", "value": "2"}], "2"),  # spec.env wins
    ({"gpus": 0}, [], None),                      # no request: torch's default
    ({"gpus": 1, "cpu": "8"}, [], None),          # GPU engine: CPU threads are not its math
])
def test_cpu_engine_threads_follow_the_cpu_request(monkeypatch, resources, env, threads):
    from engine.entrypoints.cli import add_serve_arguments, engine_kwargs

    spec = parse_spec({"model": {"uri": "pvc://models/qwen"}, "resources": resources, "env": env},
                      name="svc", namespace="default")
    container = manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]
    values = [e["value"] for e in container["env"] if e["name"] == "PAGED_CPU_THREADS"]
    assert values == ([threads] if threads else [])
    # What the engine makes of the pod's environment, through its real CLI.
    monkeypatch.delenv("PAGED_CPU_THREADS", raising=False)
    for e in container["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    parser = argparse.ArgumentParser(prog="python -m engine serve")
    add_serve_arguments(parser)
    got = engine_kwargs(parser.parse_args(container["args"])).get("cpu_threads")
    assert got == (int(threads) if threads else None)
