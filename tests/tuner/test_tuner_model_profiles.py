"""Which CPU profile, SLOs, lengths and EOS handling a sweep gets for its --model."""
import pytest

from tuner.sources import workload_source
from tuner.__main__ import _engine_flags, _slos_and_load
from tuner.arguments import build_parser


def _plan(*flags):
    parser = build_parser()
    args = parser.parse_args(["sweep", "--workload", "chat", *flags])
    source = workload_source.resolve(args, out_dir=None)
    args.workload = source.name
    return (*_slos_and_load(parser, args, source), args)


@pytest.mark.parametrize("model", [[], ["--model", "builtin://default"]])
def test_the_embedded_tiny_model_by_either_name_gets_the_tiny_profile(model):
    slos, load, profile, args = _plan(*model)
    assert slos == {"chat": {"ttft": 3.0, "tpot": 0.3}}
    assert (load.users, load.length_scale, load.ignore_eos) == (4, 0.25, True)
    assert profile["space"] == ["max_num_batched_tokens=256..2048:log"]
    assert _engine_flags(args, profile) == ("--cpu-memory-gib", "0.5")


def test_smollm2_on_cpu_gets_its_profile_and_the_models_eos():
    slos, load, profile, args = _plan("--model", "builtin://smollm2-135m-instruct")
    assert slos == {"chat": {"ttft": 3.0, "tpot": 0.3}}
    assert (load.users, load.length_scale, load.ignore_eos) == (4, 0.25, False)
    assert "space" not in profile
    assert _engine_flags(args, profile) == ("--cpu-threads", "1")
    _, _, profile, args = _plan("--model", "builtin://smollm2-135m-instruct",
                                "--engine-arg=--cpu-threads=2")
    assert _engine_flags(args, profile) == ("--cpu-threads=2",)


def test_overrides_and_other_models():
    slos, load, profile, _ = _plan("--model", "builtin://smollm2-135m-instruct", "--eos",
                                   "ignore", "--length-scale", "0.5", "--slo", "ttft=2")
    assert (load.length_scale, load.ignore_eos, slos["chat"]["ttft"]) == (0.5, True, 2.0)
    slos, load, profile, _ = _plan("--model", "/models/llama")  # a checkpoint: unscaled
    assert (profile, slos["chat"]["ttft"], load.users, load.ignore_eos) == ({}, 1.0, 8, False)
    _, load, profile, _ = _plan("--target-url", "http://127.0.0.1:9")  # model unknown
    assert (profile, load.ignore_eos, load.length_scale) == ({}, True, 1.0)
