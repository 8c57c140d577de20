"""benchmarks/bench_sim_speed.py: simulated capacity searches timed in two checkouts."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import bench_sim_speed

ROOT = Path(__file__).resolve().parents[2]


def test_two_checkouts_of_the_same_code_find_the_same_capacities(capsys):
    assert bench_sim_speed.main(["--against", str(ROOT), "--workloads", "chat",
                                 "--rounds", "1", "--repeats", "1", "--settings", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| chat |"))
    before, after = re.findall(r"\[([\d., ]+)\]", row)
    assert before == after and float(before) > 0   # the simulator is deterministic
    seconds = [float(x) for x in row.split("|")[3:5]]
    assert all(s > 0 for s in seconds)


def test_the_other_checkout_must_be_one(tmp_path):
    with pytest.raises(SystemExit):
        bench_sim_speed.main(["--against", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench_sim_speed.main(["--against", str(ROOT), "--settings", "0"])
