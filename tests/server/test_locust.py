"""A short headless Locust run of a loadtests/ workload against the server: no failures."""
from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from tests.server.conftest import REPO, scrape, wait_for

pytestmark = pytest.mark.xdist_group("server")


@pytest.mark.parametrize("workload", ["chat", "mixed"])
def test_headless_locust_run_has_zero_failures(server, tmp_path, workload):
    prefix = tmp_path / "run"
    cmd = [sys.executable, "-m", "locust", "-f", f"loadtests/{workload}.py", "--headless",
           "-u", "4", "-r", "4", "-t", "5s", "--stop-timeout", "60", "--host", server.base_url,
           "--length-scale", "0.1", "--only-summary", "--csv", str(prefix),
           "--samples-file", str(tmp_path / "samples.jsonl")]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(f"{prefix}_stats.csv") as f:
        total = next(row for row in csv.DictReader(f) if row["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 0
    assert int(total["Failure Count"]) == 0
    # and the server is left with no request and no referenced block
    assert wait_for(lambda: scrape(server.base_url)["paged:num_used_blocks"] == 0, timeout=30)
