"""The engine command the operator writes into pods parses with the engine's real CLI."""
from __future__ import annotations

import argparse
import json

import pytest

from paged_operator import manifests
from paged_api.service import parse_spec


@pytest.mark.parametrize("engine, expected", [
    ({}, {"block_size": 16, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True}),
    ({"blockSize": 32, "gpuMemoryUtilization": 0.5, "maxNumSeqs": 8, "maxNumBatchedTokens": 512,
      "maxModelLen": 2048, "enablePrefixCaching": False, "extraArgs": ["--seed", "3"]},
     {"block_size": 32, "gpu_memory_utilization": 0.5, "max_num_seqs": 8,
      "max_num_batched_tokens": 512, "max_model_len": 2048, "enable_prefix_caching": False,
      "seed": 3}),
    ({"speculative": {"numSpeculativeTokens": 4, "promptLookupMax": 3}},
     {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                             "prompt_lookup_max": 3, "prompt_lookup_min": 3}}),
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


def test_spec_engine_speculative_becomes_the_speculative_config_flag_and_the_config_map():
    """The flag carries vLLM's JSON (snake_case keys, the engine's defaults filled in); the
    ConfigMap's applied settings keep spec.engine's camelCase; without it there is no flag."""
    speculative = {"method": "ngram", "numSpeculativeTokens": 2, "promptLookupMin": 2}
    spec = parse_spec({"model": {"uri": "a/b"}, "engine": {"speculative": speculative}},
                      name="svc", namespace="default")
    args = manifests.engine_args(spec)
    flag = args.index("--speculative-config")
    assert json.loads(args[flag + 1]) == {"method": "ngram", "num_speculative_tokens": 2,
                                          "prompt_lookup_max": 2, "prompt_lookup_min": 2}
    applied = json.loads(manifests.config_map(spec)["data"]["engine-settings.json"])
    assert applied["speculative"] == {**speculative, "promptLookupMax": 2}
    plain = parse_spec({"model": {"uri": "a/b"}}, name="svc", namespace="default")
    assert "--speculative-config" not in manifests.engine_args(plain)
    assert "speculative" not in plain.engine.applied()


def engine_kwargs_in(container: dict, monkeypatch, variable: str) -> dict:
    """What the engine makes of the pod's container through its real CLI: its args and its
    environment, `variable` set only as the pod sets it."""
    from engine.entrypoints.cli import add_serve_arguments, engine_kwargs

    monkeypatch.delenv(variable, raising=False)
    for e in container["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    parser = argparse.ArgumentParser(prog="python -m engine serve")
    add_serve_arguments(parser)
    return engine_kwargs(parser.parse_args(container["args"]))


@pytest.mark.parametrize("resources, env, threads", [
    ({"gpus": 0, "cpu": "3500m"}, [], "3"),       # CPU engine: one thread per requested core
    ({"gpus": 0, "cpu": "500m"}, [], "1"),        # at least one
    ({"gpus": 0, "cpu": "8"}, [{"name": "PAGED_CPU_THREADS", "value": "2"}], "2"),  # spec.env wins
    ({"gpus": 0}, [], None),                      # no request: torch's default
    ({"gpus": 1, "cpu": "8"}, [], None),          # GPU engine: CPU threads are not its math
])
def test_cpu_engine_threads_follow_the_cpu_request(monkeypatch, resources, env, threads):
    spec = parse_spec({"model": {"uri": "pvc://models/qwen"}, "resources": resources, "env": env},
                      name="svc", namespace="default")
    container = manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]
    values = [e["value"] for e in container["env"] if e["name"] == "PAGED_CPU_THREADS"]
    assert values == ([threads] if threads else [])
    got = engine_kwargs_in(container, monkeypatch, "PAGED_CPU_THREADS").get("cpu_threads")
    assert got == (int(threads) if threads else None)


@pytest.mark.parametrize("resources, env, extra, gib", [
    ({"gpus": 0, "memory": "4Gi"}, [], [], 4 - 0.75),      # less the engine's runtime
    ({"gpus": 0, "memory": "1536Mi"}, [], [], 1.5 - 0.75),
    ({"gpus": 0, "memory": "512Mi"}, [], [], 0.5 / 4),     # at least a quarter of it
    ({"gpus": 0, "memory": "4Gi"}, [{"name": "PAGED_CPU_MEMORY_GIB", "value": "3"}], [], 3),
    ({"gpus": 0, "memory": "4Gi"}, [], ["--cpu-memory-gib", "1"], 1),   # extraArgs win
    ({"gpus": 0, "memory": "4Gi"}, [], ["--cpu-memory-gib=1.5"], 1.5),
    ({"gpus": 0}, [], [], 2.0),                            # no memory: the engine's default
    ({"gpus": 1, "memory": "4Gi"}, [], [], 2.0),           # a GPU's memory is the GPU's
])
def test_a_cpu_engine_sizes_its_pool_within_the_containers_memory(monkeypatch, resources, env,
                                                                   extra, gib):
    """gpuMemoryUtilization is a fraction of the engine's CPU memory; in a container with
    spec.resources.memory that memory is the container's less the runtime's, so a pod of
    1Gi is not given the engine's 2 GiB default (and killed for it)."""
    from paged_api.kv_cache import CPU_RUNTIME_GIB

    assert CPU_RUNTIME_GIB == 0.75
    spec = parse_spec({"model": {"uri": "pvc://models/qwen"}, "resources": resources,
                       "env": env, "engine": {"extraArgs": extra}},
                      name="svc", namespace="default")
    container = manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]
    got = engine_kwargs_in(container, monkeypatch, "PAGED_CPU_MEMORY_GIB").get("cpu_memory_gib")
    from engine.config import EngineConfig
    assert (got if got is not None else EngineConfig().cpu_memory_gib) == pytest.approx(gib)
    assert [e["name"] for e in container["env"]].count("PAGED_CPU_MEMORY_GIB") <= 1


def test_builtin_model_and_api_key_file_reach_the_engine_cli(tmp_path):
    """builtin:// goes through unchanged, the key only as a file path (never in argv)."""
    from engine.entrypoints.cli import build_parser

    spec = parse_spec({"model": {"uri": "builtin://default", "servedName": "tiny"},
                       "apiKeySecretRef": {"name": "keys", "key": "engine"},
                       "resources": {"gpus": 0}}, name="svc", namespace="default")
    pod = manifests.deployment(spec)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = build_parser().parse_args(["serve", *container["args"]])
    assert args.model == "builtin://default" and args.served_model_name == "tiny"
    assert args.api_key_file == manifests.API_KEY_FILE and args.api_key is None
    secret = next(v for v in pod["volumes"] if v["name"] == "api-key")["secret"]
    assert secret == {"secretName": "keys", "defaultMode": 0o440,
                      "items": [{"key": "engine", "path": "api-key"}]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "api-key")
    assert mount["readOnly"] is True
    assert f"{mount['mountPath']}/api-key" == manifests.API_KEY_FILE
    assert "keys" not in str(container["env"])  # not as an environment variable either


@pytest.mark.parametrize("abbreviation", [["--hos", "1.2.3.4"], ["--por=1"], ["--block", "1"],
                                          ["--served-model", "x"], ["--max-model", "99"]])
def test_abbreviations_are_refused_by_the_operator_and_by_the_engine(abbreviation):
    from engine.entrypoints.cli import build_parser

    from paged_api.service import InvalidSpecError
    with pytest.raises(InvalidSpecError, match="extraArgs"):
        parse_spec({"model": {"uri": "a/b"}, "engine": {"extraArgs": abbreviation}},
                   name="svc", namespace="default")
    with pytest.raises(SystemExit):  # were one to slip through: allow_abbrev=False
        build_parser().parse_args(["serve", "a/b", *abbreviation])


def test_router_args_parse_with_the_router_cli():
    from paged_router.cli import build_parser

    from paged_operator import manifests_access
    spec = parse_spec({"model": {"uri": "a/b"}, "router": {"enabled": True,
                                                           "policy": "least-load"}},
                      name="svc", namespace="default")
    container = manifests_access.router_deployment(spec)["spec"]["template"]["spec"][
        "containers"][0]
    assert container["command"] == ["python", "-m", "paged_router"]
    args = build_parser().parse_args(container["args"])
    assert (args.discover, args.policy, args.port) == ("svc-engine", "least-load", 8000)
    # unset: the router's default for the policy (router/paged_router/policies.py)
    assert args.host == "0.0.0.0" and args.hit_load_factor is None
    spec = parse_spec({"model": {"uri": "a/b"}, "router": {"enabled": True,
                                                           "hitLoadFactor": 2.5}},
                      name="svc", namespace="default")
    container = manifests_access.router_deployment(spec)["spec"]["template"]["spec"][
        "containers"][0]
    args = build_parser().parse_args(container["args"])
    assert (args.policy, args.hit_load_factor) == ("prefix", 2.5)
    assert args.cold_start_hold == 0.0   # no hold unless the planner may scale to zero
    spec = parse_spec({"model": {"uri": "a/b"}, "router": {"enabled": True},
                       "rollout": {"startupTimeoutSeconds": 240},
                       "autoscaling": {"mode": "slo", "minReplicas": 0, "maxReplicas": 2,
                                       "slo": {"ttftSeconds": 1}}},
                      name="svc", namespace="default")
    container = manifests_access.router_deployment(spec)["spec"]["template"]["spec"][
        "containers"][0]
    assert build_parser().parse_args(container["args"]).cold_start_hold == 240.0


def test_a_leaving_pod_keeps_accepting_first_and_drains_within_its_grace_period():
    """Engine and router pods sleep in preStop (their endpoint turns not-ready at the
    deletion, and routers stop sending meanwhile), then drain on SIGTERM: the pod's grace
    period covers the hook, the server's own drain deadline and uvicorn's margin."""
    from engine.entrypoints.server_state import ServerSettings
    from paged_router import cli as router_cli

    from paged_operator import manifests, manifests_access
    spec = parse_spec({"model": {"uri": "a/b"}, "router": {"enabled": True}},
                      name="svc", namespace="default")
    pods = [manifests.deployment(spec)["spec"]["template"]["spec"],
            manifests_access.router_deployment(spec)["spec"]["template"]["spec"]]
    drains = [ServerSettings().shutdown_grace_period + 5,   # uvicorn's deadline (cli.py)
              router_cli.SHUTDOWN_GRACE_SECONDS]
    for pod, drain in zip(pods, drains):
        hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert hook[:2] == ["python", "-c"]
        seconds = float(hook[2].rsplit("(", 1)[1].rstrip(")"))
        assert seconds == manifests.PRE_STOP_SECONDS >= 2
        assert pod["terminationGracePeriodSeconds"] >= seconds + drain, pod
