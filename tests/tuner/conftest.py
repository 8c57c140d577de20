"""Tuner tests share the fake OpenAI server of the load-test tests."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loadtests"))
