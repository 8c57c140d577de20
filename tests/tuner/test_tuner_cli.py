"""Bad arguments give a clear message and exit code 2."""
import subprocess
import sys

import pytest

from fake_openai_server import FakeOpenAIServer
from tuner.__main__ import main


def _exit(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["sweep", "--workload", "chatty"], "invalid choice: 'chatty'"),
    (["sweep", "--workload", "chat", "--param", "block_size=none", "--param",
      "gpu_memory_utilization=none", "--param", "max_num_seqs=none", "--param",
      "max_num_batched_tokens=none",
      "--param", "num_speculative_tokens=none",
      "--param", "kv_offloading_size=none"], "search space is empty"),  # chat's tune_also
    (["sweep", "--workload", "chat", "--param", "max_num_seqs=9..3"], "empty range 9..3"),
    (["sweep", "--workload", "chat", "--param", "page_size=16"], "unknown setting 'page_size'"),
    (["sweep", "--workload", "chat", "--space-file", "/nonexistent.yaml"], "no such file"),
    (["sweep", "--workload", "chat", "--slo", "p42=1"], "--slo 'p42=1'"),
    (["sweep", "--workload", "chat", "--slo", "code.ttft=1"], "KIND in chat"),
    (["sweep", "--workload", "chat", "--trials", "0"], "--trials must be at least 1"),
    (["sweep", "--workload", "chat", "--duration", "-1"], "--duration must be positive"),
    (["sweep", "--workload", "chat", "--set", "block_size=8,16"], "one value"),
    (["report", "--storage", "sqlite:///{tmp}/none.db"], "no study in"),
])
def test_bad_arguments_exit_2_with_a_message(argv, words, capsys, tmp_path):
    code, err = _exit([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2
    assert words in err


def test_unreachable_target_url_exits_2(capsys):
    with FakeOpenAIServer() as server:
        url = server.url  # a port that was just in use and is now closed
    code, err = _exit(["sweep", "--workload", "chat", "--target-url", url], capsys)
    assert code == 2 and f"--target-url {url} is not reachable" in err


def test_target_url_benchmarks_a_running_server(tmp_path, capsys):
    with FakeOpenAIServer(ttft=0.01, itl=0.002) as server:
        code = main(["sweep", "--workload", "code", "--target-url", server.url, "--duration", "2",
                     "--users", "2", "--length-scale", "0.1", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "goodput" in out
    assert (tmp_path / "bench.json").exists()


def test_real_command_line_exit_code():
    result = subprocess.run([sys.executable, "-m", "tuner", "sweep", "--workload", "nope"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "invalid choice" in result.stderr
