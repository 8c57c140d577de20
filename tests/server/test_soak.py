"""A short run of benchmarks/soak.py (docs/benchmarks/server.md's table comes from a 10-minute one):
Locust load, random disconnects, bad requests, slow readers and slow headers at once;
no unexpected 5xx, the engine alive and serving, no leaked block, backlogs in bound."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.server.conftest import REPO

pytestmark = pytest.mark.xdist_group("server")


def test_short_soak_keeps_the_server_whole():
    done = subprocess.run([sys.executable, "benchmarks/soak.py", "--duration", "10", "--users",
                           "3", "--chaos", "1"], cwd=REPO, capture_output=True, text=True,
                          timeout=240)
    table = dict(line.split("  ", 1) for line in done.stdout.splitlines() if "  " in line)
    table = {k.strip(): v.strip() for k, v in table.items()}
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert table["5xx (503 queue-full aside)"] == "0"
    assert table["leaked KV blocks (idle)"] == "0"
    assert table["engine alive, /health 200, serves after"] == "True"
    assert int(table["requests (access log)"]) > 20
    assert "400:" in table["status histogram"] and "200:" in table["status histogram"]
