"""Tuner tests share the fake OpenAI server of the load-test tests, and the router's test
harness (the SLO planner reads a router's held requests)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loadtests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "router"))
