"""One table of engine settings (api/paged_api/settings.py) is the source of the CRD's spec.engine
schema, the engine's CLI flags, EngineConfig, the operator's flag mapping and the tuner's
search space: each covers exactly the table, a valid value set in one travels through all of
them, and the same bad value is refused by each, naming the same setting."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
from cel_tools import violations
from chart_tools import CRD_FILE, ROOT, crd, crd_validator, with_spec

from paged_api import settings, settings_k8s
from engine.config import EngineConfig
from engine.entrypoints.cli import ENGINE_FLAGS, add_serve_arguments, build_parser, engine_kwargs
from paged_operator import manifests
from paged_api.service import MANAGED_FLAGS, EngineSettings, InvalidSpecError, parse_spec
from tuner.measure.local import EngineLaunch
from paged_api import search_space as space

SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
ENGINE_SCHEMA = SCHEMA["properties"]["spec"]["properties"]["engine"]
SPEC = settings.SPEC_SETTINGS


def _gen_script():
    spec = importlib.util.spec_from_file_location("gen_crd_engine",
                                                  ROOT / "scripts" / "gen_crd_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_crd_spec_engine_schema_is_the_tables():
    assert ENGINE_SCHEMA == settings_k8s.crd_engine_schema(), \
        "the CRD's spec.engine differs from the table: run python scripts/gen_crd_engine.py"
    text = CRD_FILE.read_text()
    assert _gen_script().render(text) == text  # also byte for byte (the script is idempotent)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser


def test_every_consumer_covers_exactly_the_tables_settings(monkeypatch):
    names = {s.name for s in settings.TABLE}
    monkeypatch.delenv("PAGED_CPU_MEMORY_GIB", raising=False)
    monkeypatch.delenv("PAGED_CPU_THREADS", raising=False)
    # EngineConfig: the table's fields and defaults.
    config = EngineConfig()
    assert {f.name for f in dataclasses.fields(EngineConfig)} == names
    assert {n: getattr(config, n) for n in names} == {s.name: s.default for s in settings.TABLE}
    # The CLI: a flag for each setting that has one (--model aside: also positional), and
    # no other option lands in the engine's keyword arguments.
    flagged = {s.name for s in settings.TABLE if s.flag}
    assert set(ENGINE_FLAGS) == flagged - {"model"}
    actions = {a.dest: a for a in _parser()._actions}
    for s in settings.TABLE:
        if s.flag and s.name != "model":
            assert s.flag in actions[s.name].option_strings, s.name
    assert set(engine_kwargs(_parser().parse_args([]))) == {"model"}
    # The operator: a field per spec.engine setting, and the flags it reserves.
    assert {f.name for f in dataclasses.fields(EngineSettings)} == \
        {s.name for s in SPEC} | {"extra_args"}
    reserved = {s.flag for s in settings.TABLE if s.managed} | \
        {s.flag.replace("--", "--no-") for s in settings.TABLE if s.managed and s.type is bool}
    assert set(MANAGED_FLAGS) == reserved | set(settings_k8s.OPERATOR_SERVER_FLAGS)
    assert set(ENGINE_SCHEMA["properties"]) == {s.field for s in SPEC} | {"extraArgs"}
    # The tuner: what it may vary is what spec.engine holds; its default space, the table's.
    keys = {k.name: k for s in SPEC for k in s.keys if k.tune}   # num_speculative_tokens
    # ... and the rows of other sections of the spec (the host KV tier at
    # spec.kvCache.offloadGiB), searched only when a workload asks (not in the default space)
    outside = {s.name: s for s in settings.IN_SPEC if s.section != "engine"}
    assert set(outside) == {"kv_offloading_size"}
    assert space.SETTINGS == {s.name: s for s in SPEC} | keys | outside
    spec_props = SCHEMA["properties"]["spec"]["properties"]
    for s in settings.IN_SPEC:   # every row is in the CRD at spec.<section>.<field>
        assert s.field in spec_props[s.section]["properties"], s.name
    assert space.DEFAULT_SPACE == {s.name: s.tune for s in [*SPEC, *keys.values()] if s.tune}


def _valid_other_value(s: settings.Setting):
    """A valid value other than the default, from the table's rule."""
    if s.type is bool:
        return not s.default
    if s.power_of_two:
        return int(s.maximum)
    if s.type is float:
        return 0.5 if (s.maximum or 1) >= 0.5 and s.default != 0.5 else 0.25
    if s.type is dict:  # every key given (nothing left for the engine to fill in) but
        # another method's (the last choice of speculative_config's method is suffix)
        value = {k.name: k.choices[-1] if k.choices else 0.5 if k.type is float
                 else int(k.minimum) + 2 for k in s.keys}
        return {k: v for k, v in value.items() if not k.startswith("prompt_lookup_")}
    return (s.default or int(s.minimum or 1)) + 7


def _camel(s: settings.Setting, value):
    return {k.field: value[k.name] for k in s.keys if k.name in value} \
        if s.type is dict else value


def test_a_spec_engine_value_reaches_the_engine_through_operator_and_cli():
    """spec.engine -> operator flags -> the engine's real CLI -> EngineConfig, and the tuner
    maps the same settings to the same flags and spec.engine keys."""
    values = {s.name: _valid_other_value(s) for s in SPEC}
    values["max_num_batched_tokens"] = max(values["max_num_batched_tokens"],
                                           values["max_num_seqs"])
    engine = space.to_engine_spec(values)
    assert engine == {s.field: _camel(s, values[s.name]) for s in SPEC}
    assert engine["speculative"] == {"method": "suffix", "numSpeculativeTokens": 3,
                                     "disableByBatchSize": 3, "minAcceptanceRate": 0.5,
                                     "acceptanceProbeInterval": 3,
                                     "adaptiveDraftKnee": 3,
                                     "suffixDecodingMaxTreeDepth": 3,
                                     "suffixDecodingMaxCachedRequests": 2,
                                     "suffixDecodingMaxSpecFactor": 0.5,
                                     "suffixDecodingMinTokenProb": 0.5}
    spec = parse_spec({"model": {"uri": "a/b"}, "engine": engine}, name="svc", namespace="d")
    assert spec.engine.applied() == {**engine, "extraArgs": []}
    args = manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]["args"]
    kwargs = engine_kwargs(build_parser().parse_args(["serve", *args]))
    config = EngineConfig(**kwargs)
    assert {s.name: getattr(config, s.name) for s in SPEC} == values
    launched = EngineLaunch().process(values, Path("engine.log"))   # a tuner trial's engine
    flags = launched.command[launched.command.index("--port") + 2:]
    tuner_kwargs = engine_kwargs(build_parser().parse_args(["serve", *flags]))
    assert {n: tuner_kwargs[n] for n in values} == values
    # the baseline's values, and its key dimensions beside them (to compare with trials)
    # (num_speculative_tokens is the method and its length: this one's is suffix, 3)
    assert space.from_engine_spec(engine) == {**values, "num_speculative_tokens": "suffix:3"}


def _bad_values(s: settings.Setting):
    if s.power_of_two:
        yield 3
    if s.minimum is not None:
        yield s.minimum if s.exclusive_minimum else s.type(s.minimum) - 1
    if s.maximum is not None:
        yield s.type(s.maximum) + 1
    if s.choices is not None:
        yield "no-such-choice"


BAD = [(s, v) for s in settings.TABLE for v in _bad_values(s)]


@pytest.mark.parametrize("s, value", BAD, ids=[f"{s.name}={v}" for s, v in BAD])
def test_the_same_bad_value_is_refused_everywhere_naming_the_setting(s, value, capsys):
    assert {"block_size", "gpu_memory_utilization"} <= {b.name for b, _ in BAD}
    rule = re.escape(s.rule)
    with pytest.raises(ValueError, match=f"^{s.name} must be {rule}, got"):
        EngineConfig(**{s.name: value})
    if s.flag and s.name != "model":
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", s.flag, str(value)])
        assert re.search(f"argument {s.flag}: must be {rule}, got", capsys.readouterr().err)
    if s.field:   # at spec.<section>.<field>: spec.engine.blockSize, spec.kvCache.offloadGiB
        with pytest.raises(InvalidSpecError,
                           match=f"^spec.{s.section}.{s.field} must be {rule}, got"):
            parse_spec({"model": {"uri": "a/b"}, s.section: {s.field: value}}, name="svc",
                       namespace="d")
        errors = list(crd_validator().iter_errors(
            with_spec(**{f"{s.section}__{s.field}": value})))
        assert [list(e.absolute_path) for e in errors] == [["spec", s.section, s.field]]
        if s.type is not str:
            with pytest.raises(space.SpaceError, match=f"^{s.name} must be {rule}"):
                space.parse_param(s.name, str(value))


DICT = [s for s in SPEC if s.type is dict]
KEY_BAD = [(s, k, v) for s in DICT for k in s.keys for v in _bad_values(k)]


def _required(s: settings.Setting, by_field: bool) -> dict:
    return {k.field if by_field else k.name: int(k.minimum) for k in s.keys
            if k.default is None and not k.optional}


@pytest.mark.parametrize("s, key, value", KEY_BAD,
                         ids=[f"{s.name}.{k.name}={v}" for s, k, v in KEY_BAD])
def test_a_bad_key_of_an_object_setting_is_refused_everywhere_naming_the_key(s, key, value,
                                                                             capsys):
    """spec.engine.speculative.numSpeculativeTokens: 17 is refused by the engine, its CLI,
    the operator and the CRD's schema, each naming the key as its source spells it."""
    assert {"speculative_config"} <= {s.name for s in DICT}
    rule = re.escape(key.rule)
    given = {**_required(s, False), key.name: value}
    with pytest.raises(ValueError, match=f"^{s.name}.{key.name} must be {rule}, got"):
        EngineConfig(**{s.name: given})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", *settings.flags_for({s.name: given})])
    assert re.search(f"argument {s.flag}: {key.name} must be {rule}, got", capsys.readouterr().err)
    spec_value = {**_required(s, True), key.field: value}
    with pytest.raises(InvalidSpecError,
                       match=f"^spec.engine.{s.field}.{key.field} must be {rule}, got"):
        parse_spec({"model": {"uri": "a/b"}, "engine": {s.field: spec_value}}, name="svc",
                   namespace="d")
    errors = list(crd_validator().iter_errors(with_spec(**{f"engine__{s.field}": spec_value})))
    assert [list(e.absolute_path) for e in errors] == [["spec", "engine", s.field, key.field]]


@pytest.mark.parametrize("s", DICT, ids=[s.name for s in DICT])
def test_an_object_setting_without_a_required_key_is_refused_by_operator_and_crd(s):
    for key in (k for k in s.keys if k.default is None and not k.optional):
        value = {k: v for k, v in _required(s, True).items() if k != key.field}
        with pytest.raises(InvalidSpecError,
                           match=f"^spec.engine.{s.field}.{key.field} is required"):
            parse_spec({"model": {"uri": "a/b"}, "engine": {s.field: value}}, name="svc",
                       namespace="d")
        errors = list(crd_validator().iter_errors(with_spec(**{f"engine__{s.field}": value})))
        assert [e.validator for e in errors] == ["required"]
        assert key.field in errors[0].message


@pytest.mark.parametrize("seqs, tokens", [(64, 32), (None, 8), (4096, None)])
def test_batched_tokens_below_seqs_is_refused_everywhere(seqs, tokens, capsys):
    """vLLM's rule max_num_batched_tokens >= max_num_seqs, an unset side at the engine's
    default (256 seqs, 2048 tokens): EngineConfig, the CLI, the operator and the CRD's CEL."""
    given = {k: v for k, v in (("max_num_seqs", seqs), ("max_num_batched_tokens", tokens))
             if v is not None}
    seqs, tokens = seqs or 256, tokens or 2048
    with pytest.raises(ValueError, match=rf"^max_num_batched_tokens \({tokens}\) must be >= "
                                         rf"max_num_seqs \({seqs}\)"):
        EngineConfig(**given)
    argv = ["serve", *settings.flags_for(given)]
    with pytest.raises(SystemExit, match=rf"--max-num-batched-tokens \({tokens}\) must be >= "
                                         rf"--max-num-seqs \({seqs}\)"):
        engine_kwargs(build_parser().parse_args(argv))
    fields = {settings.SETTINGS[n].field: v for n, v in given.items()}
    with pytest.raises(InvalidSpecError, match=rf"^spec.engine.maxNumBatchedTokens \({tokens}\) "
                                               rf"must be >= spec.engine.maxNumSeqs \({seqs}\)"):
        parse_spec({"model": {"uri": "a/b"}, "engine": fields}, name="svc", namespace="d")
    body = with_spec(**{f"engine__{k}": v for k, v in fields.items()})
    assert not list(crd_validator().iter_errors(body))  # each value alone is fine...
    assert [r.path for r in violations(SCHEMA, body)] == ["spec.engine"]  # ...together not
