"""Search-space grammar, files, errors, and the mapping to flags and spec.engine keys."""
from pathlib import Path

import optuna
import pytest

from tuner.measure.local import EngineLaunch
from paged_api.search_space import SpaceError, build_space, parse_param, to_engine_spec


def test_default_space_has_the_five_settings_and_block_sizes_are_powers_of_two():
    space = {p.name: p for p in build_space()}
    assert set(space) == {"block_size", "gpu_memory_utilization", "max_num_seqs",
                          "max_num_batched_tokens", "num_speculative_tokens"}
    assert space["block_size"].choices == (8, 16, 32, 64, 128)
    wide = {p.name: p for p in build_space(wide_block_sizes=True)}
    assert wide["block_size"].choices == (1, 2, 4, 8, 16, 32, 64, 128, 256)


@pytest.mark.parametrize("spec, expected", [
    ("8,16", dict(choices=(8, 16))),
    ("pow2:3..40", dict(choices=(4, 8, 16, 32))),
    ("1..64:log", dict(low=1, high=64, log=True)),
    ("0.5..0.9:step=0.1", dict(low=0.5, high=0.9, step=0.1)),
])
def test_grammar(spec, expected):
    name = "gpu_memory_utilization" if "0.5" in spec else "max_num_seqs"
    param = parse_param(name, spec)
    for key, value in expected.items():
        assert getattr(param, key) == pytest.approx(value) if key != "choices" \
            else getattr(param, key) == value


@pytest.mark.parametrize("name, spec, words", [
    ("max_num_seqs", "64..1", "empty range"),
    ("max_num_seqs", "", "empty"),
    ("max_num_seqs", [], "empty list"),
    ("max_num_seqs", "1.5,2", "not an integer"),
    ("block_size", "pow2:5..7", "no power of two"),
    ("blocksize", "8", "unknown setting"),
    ("max_num_seqs", "1..8:fast", "unknown range option"),
    ("enable_prefix_caching", "maybe", "true/false"),
])
def test_bad_specs_name_the_setting(name, spec, words):
    with pytest.raises(SpaceError, match=words):
        parse_param(name, spec)


def test_overrides_removal_and_empty_space(tmp_path):
    space = build_space(params=["max_num_seqs=4,8", "max_num_batched_tokens=none"])
    names = {p.name: p for p in space}
    assert names["max_num_seqs"].choices == (4, 8) and "max_num_batched_tokens" not in names
    with pytest.raises(SpaceError, match="empty"):
        build_space(params=[f"{n}=none" for n in ("block_size", "gpu_memory_utilization",
                                                  "max_num_seqs", "max_num_batched_tokens",
                                                  "num_speculative_tokens")])
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    with pytest.raises(SpaceError, match="empty"):
        build_space(space_file=str(empty))
    with pytest.raises(SpaceError, match="NAME=SPEC"):
        build_space(params=["max_num_seqs"])


def test_space_file_mixes_strings_lists_and_ranges(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("block_size: [16, 32]\nmax_num_seqs: {low: 2, high: 8, step: 2}\n"
                    "gpu_memory_utilization: '0.6..0.8:step=0.1'\nenable_prefix_caching: [true, false]\n")
    space = {p.name: p for p in build_space(space_file=str(path))}
    assert space["block_size"].grid_values() == [16, 32]
    assert space["max_num_seqs"].grid_values() == [2, 4, 6, 8]
    assert space["gpu_memory_utilization"].grid_values() == [0.6, 0.7, 0.8]
    assert space["enable_prefix_caching"].choices == (True, False)


def test_suggest_stays_inside_the_space():
    space = build_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        trial = study.ask()
        values = {p.name: p.suggest(trial) for p in space}
        assert values["block_size"] in (8, 16, 32, 64, 128)
        assert 1 <= values["max_num_seqs"] <= 64
        assert 0.5 <= values["gpu_memory_utilization"] <= 0.95 + 1e-9
        study.tell(trial, 0.0)


def test_flags_and_engine_spec_keys():
    settings = {"block_size": 16, "gpu_memory_utilization": 0.85000001, "max_num_seqs": 32,
                "max_num_batched_tokens": 2048, "enable_prefix_caching": False}
    # flags only where a trial's engine process starts, before the flags every trial shares
    process = EngineLaunch(extra_flags=("--cpu-threads", "1")).process(settings, Path("log"))
    assert process.command[process.command.index("--port") + 2:] == [
        "--block-size", "16", "--gpu-memory-utilization", "0.85000001", "--max-num-seqs", "32",
        "--max-num-batched-tokens", "2048", "--no-enable-prefix-caching", "--cpu-threads", "1"]
    assert to_engine_spec(settings) == {
        "blockSize": 16, "gpuMemoryUtilization": 0.85, "maxNumSeqs": 32,
        "maxNumBatchedTokens": 2048, "enablePrefixCaching": False}
