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
