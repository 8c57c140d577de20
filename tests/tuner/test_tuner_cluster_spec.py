"""The PagedInferenceTuning spec at the tuner's boundary, and the status tables it writes."""
from __future__ import annotations

import pytest

from tuner.incluster.job import pareto
from paged_api.contract import CapacitySpec, WorkloadFrom, parse_duration, parse_tuning

BASE = {"targetRef": {"name": "svc"}, "searchSpace": {"maxNumSeqs": [4, 8]}}


def test_the_issue_example_parses_with_camel_case_mapped_to_settings() -> None:
    spec = parse_tuning({**BASE, "workload": "summarize", "trials": 24, "parallelism": 2,
                         "trialDuration": "2m", "users": 16,
                         "slo": {"ttftSeconds": 1.0, "itlSeconds": 0.1},
                         "searchSpace": {"blockSize": [16, 32, 64],
                                         "maxNumSeqs": {"min": 8, "max": 512, "log": True}},
                         "apply": {"mode": "Auto", "minGain": 1.1}})
    assert spec.duration == 120 and spec.parallelism == 2 and spec.mode == "Auto"
    assert dict(spec.slo) == {"ttft": 1.0, "tpot": 0.1}
    block, seqs = spec.space
    assert block.name == "block_size" and block.choices == (16, 32, 64)
    assert (seqs.name, seqs.low, seqs.high, seqs.log) == ("max_num_seqs", 8, 512, True)


@pytest.mark.parametrize("change, field", [
    ({"targetRef": {}}, "spec.targetRef.name"),
    ({"workload": "poetry"}, "spec.workload"),
    ({"searchSpace": {"blocksize": [16]}}, "spec.searchSpace.blocksize"),
    ({"searchSpace": {"maxNumSeqs": {"low": 1, "high": 4}}}, "spec.searchSpace.maxNumSeqs"),
    ({"searchSpace": {}}, "spec.searchSpace"),
    ({"trialDuration": "soon"}, "spec.trialDuration"),
    ({"trials": 0}, "spec.trials"),
    ({"apply": {"mode": "Sometimes"}}, "spec.apply.mode"),
    ({"confirm": {"rounds": 1}}, "spec.rounds"),
    ({"users": 4, "rate": 2.0}, "spec.users and spec.rate"),
])
def test_bad_specs_name_the_field_to_change(change: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse_tuning({**BASE, **change})


def test_durations() -> None:
    assert [parse_duration(v, "x") for v in (90, "90", "90s", "1.5m", "1h")] == \
        [90, 90, 90, 90, 3600]


def test_pareto_keeps_trials_no_other_beats_on_goodput_and_ttft() -> None:
    history = [{"engine": {"maxNumSeqs": n}, "goodput": g, "ttftP99": t}
               for n, g, t in ((4, 5.0, 0.5), (8, 6.0, 0.9), (16, 4.0, 0.95), (32, 6.0, 0.4))]
    history.append({"engine": {"blockSize": 8}, "infeasible": "out of memory"})
    assert [e["engine"]["maxNumSeqs"] for e in pareto(history)] == [32]
    history.append({"engine": {"maxNumSeqs": 2}, "goodput": 3.0, "ttftP99": 0.1})
    assert [e["engine"]["maxNumSeqs"] for e in pareto(history)] == [32, 2]


def test_workload_from_a_trace_or_prometheus_with_load_workers_and_capacity() -> None:
    spec = parse_tuning({**BASE, "loadWorkers": 3, "capacity": {"maxProbes": 4},
                         "workloadFrom": {"trace": {"configMapRef": {"name": "traffic"}}}})
    assert spec.workload_from == WorkloadFrom("trace", config_map=("traffic", "trace.jsonl"))
    assert spec.load_workers == 3 and spec.capacity == CapacitySpec(4, 0.9, 60.0)
    held = parse_tuning({**BASE, "capacity": {"sustainSeconds": 0}}).capacity
    assert held == CapacitySpec(6, 0.9, 0.0)
    spec = parse_tuning({**BASE, "workloadFrom": {"trace": {"url": "https://x/t.jsonl"}}})
    assert spec.workload_from == WorkloadFrom("trace", url="https://x/t.jsonl")
    spec = parse_tuning({**BASE, "prometheus": {"url": "http://prom:9090"},
                         "workloadFrom": {"prometheus": {"window": "6h", "selector": 'a="b"'}}})
    assert spec.workload_from == WorkloadFrom("prometheus", window="6h", selector='a="b"')
    assert spec.prometheus_url == "http://prom:9090"
    plain = parse_tuning(BASE)
    assert plain.workload_from is None and plain.load_workers == 1 and plain.capacity is None
    assert plain.workload == "chat"


@pytest.mark.parametrize("change, field", [
    ({"workload": "chat", "workloadFrom": {"trace": {"url": "https://x"}}},
     "spec.workload and spec.workloadFrom"),
    ({"workloadFrom": {"prometheus": {"window": "24h"}}},
     "spec.workloadFrom.prometheus needs spec.prometheus.url"),
    ({"workloadFrom": {"prometheus": {"window": "a day"}}, "prometheus": {"url": "http://p"}},
     "spec.workloadFrom.prometheus.window"),
    ({"workloadFrom": {"trace": {}}}, "spec.workloadFrom.trace"),
    ({"workloadFrom": {"trace": {"url": "ftp://x"}}}, "spec.workloadFrom.trace.url"),
    ({"workloadFrom": {"trace": {"configMapRef": {"key": "k"}}}},
     "spec.workloadFrom.trace.configMapRef.name"),
    ({"workloadFrom": {"nfs": {}}}, "spec.workloadFrom"),
    ({"loadWorkers": 0}, "spec.loadWorkers"),
    ({"capacity": {"attainment": 1.5}}, "spec.capacity.attainment"),
    ({"capacity": {"sustainSeconds": -1}}, "spec.sustainSeconds must be at least 0"),
    ({"capacity": {"sustainSeconds": 7200}}, "spec.capacity.sustainSeconds: at most 3600"),
    ({"capacity": {"sustainSeconds": "1m"}}, "spec.sustainSeconds: expected float"),
])
def test_bad_load_sources_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse_tuning({**BASE, **change})


def test_an_unset_search_space_is_the_settings_tables_default_ranges() -> None:
    from paged_api.settings import SPEC_SETTINGS
    from paged_api.search_space import parse_param

    spec = parse_tuning({"targetRef": {"name": "svc"}})
    tuned = {s.name: s.tune for s in SPEC_SETTINGS if s.tune} | {
        k.name: k.tune for s in SPEC_SETTINGS for k in s.keys if k.tune}  # num_speculative_tokens
    assert {"block_size", "gpu_memory_utilization", "max_num_seqs",
            "max_num_batched_tokens"} <= set(tuned)
    assert spec.space == tuple(parse_param(name, text) for name, text in tuned.items())
    # ... to which the Job adds what chat, the default workload, asks for (tune_also)
    from tuner.incluster.load import with_opt_in
    chat = with_opt_in(spec, {"targetRef": {"name": "svc"}})
    assert chat.space == spec.space + (parse_param("kv_offloading_size", [0, 0.5, 1, 2, 4]),)
    # given but empty is still a mistake to name
    with pytest.raises(ValueError, match="spec.searchSpace: give at least one"):
        parse_tuning({"targetRef": {"name": "svc"}, "searchSpace": {}})
