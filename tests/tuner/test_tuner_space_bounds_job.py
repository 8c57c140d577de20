"""`python -m tuner tune --cluster` with a fake cluster: the Job bounds the default space
before the study (status.searchSpace, status.searchSpaceNotes, its log), and a target that
fits the model at no fraction fails the tuning with the reason naming what to change."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

GIB = 2**30


def run_job(monkeypatch, tmp_path, target_spec: dict, spec: dict | None = None):
    from tuner.incluster import job

    body = {"metadata": {"name": "tune"}, "spec": {"targetRef": {"name": "svc"},
                                                   "workload": "code", **(spec or {})}}
    written: list[dict] = []
    fake = SimpleNamespace(ns="ns", get_tuning=lambda: body, stopping=SimpleNamespace(
        is_set=lambda: False), get_service=lambda name: {"metadata": {"name": name},
                                                         "spec": target_spec},
        write_status=written.append)
    monkeypatch.setattr(job, "load_client", lambda: None)
    monkeypatch.setattr(job, "Cluster", lambda api, ns, name: fake)
    monkeypatch.setattr(job.cluster_load, "workload_source", lambda spec, **kw: None)
    monkeypatch.setattr(job.signal, "signal", lambda *a: None)
    seen = []

    class Tuning:
        def __init__(self, cluster, body, spec, *rest) -> None:
            seen.append(spec)

        def run(self, storage, *, index) -> None:
            pass
    monkeypatch.setattr(job, "Tuning", Tuning)
    assert job.main(["--cluster", "--name", "tune", "--out-dir", str(tmp_path)]) == 0
    return seen, written


def small_target(path: str, gib: float, memory: str | None = None) -> dict:
    return {"model": {"uri": path}, "engine": {"maxModelLen": 256},
            "resources": {"gpus": 0, **({"memory": memory} if memory else {})},
            "env": [{"name": "PAGED_CPU_MEMORY_GIB", "value": repr(gib)}]}


def test_the_job_searches_the_bounded_space_and_shows_it(monkeypatch, tmp_path, capsys,
                                                         tiny_checkpoints) -> None:
    from tuner.incluster.model_facts import model_facts

    path = tiny_checkpoints["llama"]
    facts = model_facts(path)
    need = facts.parameters * 4 + 256 * facts.kv_shape.bytes_per_token(4)
    seen, written = run_job(monkeypatch, tmp_path, small_target(path, need / 0.83 / GIB))
    fraction = next(p for p in seen[0].space if p.name == "gpu_memory_utilization")
    assert (fraction.low, fraction.high) == (pytest.approx(0.85), 0.95)
    status = next(w for w in written if "searchSpace" in w)
    assert status["searchSpace"]["gpuMemoryUtilization"]["min"] == pytest.approx(0.85)
    assert set(status["searchSpace"]) >= {"blockSize", "maxNumSeqs", "maxNumBatchedTokens"}
    assert "search space: gpu_memory_utilization 0.5..0.95 -> 0.85..0.95" in \
        capsys.readouterr().err


def test_a_target_too_small_for_the_model_fails_the_tuning(monkeypatch, tmp_path,
                                                          tiny_checkpoints) -> None:
    seen, written = run_job(monkeypatch, tmp_path,
                            small_target(tiny_checkpoints["llama"], 2.0, memory="600Ki"))
    assert seen == []   # no study
    assert written[-1]["phase"] == "Failed"
    reason = written[-1]["decision"]["reason"]
    assert reason.startswith("spec.targetRef: svc cannot hold") and \
        "raise spec.resources.memory above" in reason
