"""The capacity sweep's command line (tuner/search/capacity_cli.py): its flags checked by
name, the default objective, the simulated window."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv, message", [
    (["--engine-cmd", "x"], "with --engine-cmd use --objective goodput"),
    (["--rate", "3"], "the capacity objective searches the rate itself"),
    (["--attainment", "0"], "--attainment must be in (0, 1]"),
    (["--sustain", "nan"], "sustain (--sustain, spec.capacity.sustainSeconds)"),
    (["--target-rate", "-1"], "--target-rate must be > 0"),
    (["--real-probes", "1"], "--real-probes must be at least 2"),
    (["--acceptance", "2"], "--acceptance must be in [0, 1]"),
    (["--sim-warmup-requests", "-5"], "--sim-warmup-requests -5: the simulator's warm-up"),
    (["--sim-workers", "0"], "--sim-workers must be >= 1"),
])
def test_capacity_flags_are_checked(capsys, argv, message):
    from tuner.__main__ import main
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--workload", "chat", "--objective", "capacity", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_default_objective_is_capacity_except_for_another_server():
    from tuner.arguments import build_parser
    from tuner.search.capacity_cli import objective
    parse = build_parser().parse_args
    assert objective(parse(["sweep", "--workload", "chat"])) == "capacity"
    assert objective(parse(["sweep", "--workload", "chat", "--engine-cmd", "x"])) == "goodput"
    assert objective(parse(["sweep", "--workload", "chat", "--target-url", "u"])) == "goodput"
    assert objective(parse(["sweep", "--workload", "chat", "--objective", "pareto"])) == \
        "pareto"


def test_a_simulated_load_scores_the_window_a_real_one_does():
    """The sweep's simulated loads last as long as its real ones (--duration) unless
    --sim-duration says otherwise, and `tuner simulate`'s default is the real default."""
    from tuner.arguments import DEFAULT_DURATION, build_parser
    from tuner.search.capacity_cli import sim_duration
    from tuner.sim.context import DEFAULT_SIM_DURATION
    parse = build_parser().parse_args
    args = parse(["sweep", "--workload", "chat", "--duration", "7"])
    assert sim_duration(args.sim_duration, args.duration) == 7.0
    args = parse(["sweep", "--workload", "chat", "--duration", "7", "--sim-duration", "20"])
    assert sim_duration(args.sim_duration, args.duration) == 20.0
    args = parse(["sweep", "--workload", "chat"])
    assert sim_duration(args.sim_duration, args.duration) == DEFAULT_DURATION
    assert DEFAULT_SIM_DURATION == DEFAULT_DURATION


def test_the_simulated_engines_take_the_cpu_memory_the_real_ones_do(monkeypatch, tmp_path):
    """Neither --cpu-memory-gib nor the model's sweep profile names the CPU memory: the
    simulated engines (and the fit of the pilot's pool to them) take the engine's own
    default, as an engine launched without the flag does (PAGED_CPU_MEMORY_GIB, else the
    settings table's); a profile calibrated on a GPU keeps its device."""
    import dataclasses

    from paged_api.settings import SETTINGS
    from tuner import arguments
    from tuner.__main__ import main
    from tuner.search import capacity_sweep
    from tuner.search.capacity_cli import engines_cpu_gib
    from tuner.sim.calibrate import config_profile
    from tuner.sim.context import engine_threads

    cpu = config_profile(None, engine_threads({}))
    gpu = dataclasses.replace(cpu, memory=dataclasses.replace(cpu.memory, device_bytes=80e9))
    monkeypatch.delenv("PAGED_CPU_MEMORY_GIB", raising=False)
    assert engines_cpu_gib(None, cpu) == SETTINGS["cpu_memory_gib"].default
    assert engines_cpu_gib(1.5, cpu) == 1.5 and engines_cpu_gib(None, gpu) is None
    monkeypatch.setenv("PAGED_CPU_MEMORY_GIB", "3")
    assert engines_cpu_gib(None, cpu) == 3.0

    # the sweep of a model whose profile names no CPU memory hands it to its simulator
    path = tmp_path / "profile.json"
    cpu.save(path)
    monkeypatch.delitem(arguments.TINY_PROFILE, "cpu_memory_gib")
    plans = []

    class Planned(Exception):
        pass

    def planned(config, plan):
        plans.append(plan)
        raise Planned

    monkeypatch.setattr(capacity_sweep, "run_capacity_sweep", planned)
    with pytest.raises(Planned):
        main(["sweep", "--workload", "chat", "--profile", str(path),
              "--out-dir", str(tmp_path / "out")])
    assert plans[0].sim_base == {"cpu_memory_gib": 3.0}
    with pytest.raises(Planned):
        main(["sweep", "--workload", "chat", "--profile", str(path), "--cpu-memory-gib", "1",
              "--out-dir", str(tmp_path / "out")])
    assert plans[1].sim_base == {"cpu_memory_gib": 1.0}
