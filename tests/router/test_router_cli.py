"""`python -m paged_router`: its flags, its errors, and an import path free of torch."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from router_harness import REPO, Process

from paged_router.cli import main


def run(capsys, *args: str) -> tuple[int | str, str]:
    """The CLI's main() in-process: (exit code or message, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return exc.value.code, capsys.readouterr().err


def test_the_router_never_imports_torch_or_transformers():
    code = ("import sys\n"
            "import paged_router.__main__\n"
            "from paged_router.app import RouterConfig, build_app\n"
            "import paged_router.discovery\n"
            "build_app(RouterConfig(backends=['http://127.0.0.2:8000']))\n"
            "bad = [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_the_engine_names_the_routers_own_command_and_loads_nothing():
    """The engine's old `router` subcommand fails, naming the new command to run."""
    code = ("import sys\n"
            "from engine.__main__ import main\n"
            "try:\n"
            "    main(['router', '--backends', 'http://a:1'])\n"
            "except SystemExit as exc:\n"
            "    print(exc.code)\n"
            "bad = [m for m in ('torch', 'paged_router') if m in sys.modules]\n"
            "assert not bad, bad\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60,
                         capture_output=True, text=True).stdout
    assert "`python -m paged_router --backends http://a:1`" in out, out


def test_bad_flags_say_what_to_change(capsys):
    code, _ = run(capsys, "--backends", "127.0.0.2:8000")
    assert "http://" in str(code)
    code, err = run(capsys, "--port", "0")
    assert code == 2 and "--backends" in err and "--discover" in err
    code, err = run(capsys, "--backends", "http://a:1", "--policy", "random")
    assert code == 2 and "round-robin" in err
    code, _ = run(capsys, "--backends", "http://a:1", "--chunk-chars", "0")
    assert code == "--chunk-chars must be >= 1, got 0"
    code, _ = run(capsys, "--backends", "http://a:1", "--tokenizer", "/nonexistent")
    assert "tokenizer.json" in str(code)
    code, _ = run(capsys, "--backends", "http://a:1", "--load-factor", "-1")
    assert "--load-factor must be >= 0" in str(code)
    code, _ = run(capsys, "--backends", "http://a:1", "--hit-load-factor", "-1")
    assert "--hit-load-factor must be >= 0" in str(code)
    code, _ = run(capsys, "--backends", "http://a:1", "--cold-start-hold", "-1")
    assert code == "--cold-start-hold must be >= 0 (seconds) and --cold-start-queue >= 1"
    code, _ = run(capsys, "--backends", "http://a:1", "--cold-start-queue", "0")
    assert code == "--cold-start-hold must be >= 0 (seconds) and --cold-start-queue >= 1"
    code, err = run(capsys, "--backends", "http://a:1", "--cache-balance", "some")
    assert code == 2 and "--cache-balance" in err and "'off'" in err


def test_cache_balance_takes_a_number_or_off():
    from paged_router.cli import build_parser

    parse = lambda *a: build_parser().parse_args(["--backends", "http://a:1", *a])  # noqa: E731
    assert parse().cache_balance == "default" and parse().hit_load_factor is None  # per policy
    assert parse("--hit-load-factor", "2").hit_load_factor == 2.0
    assert parse("--cache-balance", "off").cache_balance is None
    assert parse("--cache-balance", "0.5").cache_balance == 0.5


def test_the_cli_serves_and_reports_its_backends():
    import httpx

    p = Process(["paged_router", "--host", "127.0.0.1", "--port", "0", "--policy", "least-load",
                 "--backends", "http://127.0.0.9:9", "--health-interval", "0.1"],
                "routing on", ready_path=None)  # nothing listens at 127.0.0.9:9
    try:
        deadline = time.monotonic() + 20
        while (r := httpx.get(p.url + "/health")).status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert r.json() == {"healthy_backends": 0, "backends": 1, "policy": "least-load"}
        assert 'paged_router_backends{state="ejected"} 1.0' in httpx.get(p.url + "/metrics").text
    finally:
        p.kill()


def test_the_key_comes_from_a_file_and_an_empty_or_missing_file_is_refused(capsys, tmp_path):
    import httpx

    code, _ = run(capsys, "--backends", "http://a:1", "--api-key-file", str(tmp_path / "nope"))
    assert "--api-key-file" in str(code) and "No such file" in str(code)
    (tmp_path / "empty").write_text("\n")
    code, _ = run(capsys, "--backends", "http://a:1", "--api-key-file", str(tmp_path / "empty"))
    assert str(code).endswith("is empty")
    (tmp_path / "key").write_text("sk-from-file\n")
    p = Process(["paged_router", "--host", "127.0.0.1", "--port", "0", "--backends",
                 "http://127.0.0.9:9", "--api-key-file", str(tmp_path / "key")],
                "routing on", ready_path=None)
    try:
        assert httpx.get(p.url + "/v1/models").status_code == 401
        assert "sk-from-file" not in " ".join(p.proc.args)
        r = httpx.get(p.url + "/v1/models", headers={"Authorization": "Bearer sk-from-file"})
        assert r.status_code != 401
    finally:
        p.stop()


def test_discovery_defaults_to_the_pods_namespace_from_the_downward_api(monkeypatch):
    from kubernetes import config as kube_config

    from paged_router.discovery import EndpointSliceWatcher
    from paged_router.metrics import RouterMetrics
    from paged_router.pool import BackendPool

    monkeypatch.setattr(kube_config, "load_incluster_config",
                        lambda: (_ for _ in ()).throw(kube_config.ConfigException("no")))
    monkeypatch.setattr(kube_config, "load_kube_config", lambda *a, **k: None)
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    pool = BackendPool(RouterMetrics())
    assert EndpointSliceWatcher("engines", pool).namespace == "team-a"
    assert EndpointSliceWatcher("engines", pool, namespace="b").namespace == "b"
