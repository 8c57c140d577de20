"""lm-evaluation-harness against the server (`local-completions`: echo + logprobs,
max_tokens 1, token-id prompts) gives the per-sample loglikelihoods and the accuracy of
lm-eval's own `hf` backend on the same checkpoint; prefix caching is on (every question's
choices share its prompt; a request that asks for prompt logprobs recomputes its prompt
rather than read the cache, so no position goes missing)."""
from __future__ import annotations

from pathlib import Path

import lm_eval  # scripts/setup.sh installs it (pyproject's `eval` extra says why not as a dependency)
import pytest

from tests.server.conftest import scrape

pytestmark = pytest.mark.xdist_group("server")

TASK_DIR = Path(__file__).parent / "lm_eval_task"
TASK = "paged_tiny_mc"


def _evaluate(model: str, model_args: dict) -> dict:
    from lm_eval.tasks import TaskManager

    # only this folder's task: indexing lm-eval's thousands of built-in ones takes ~20 s
    tasks = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    return lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=[TASK], log_samples=True,
        task_manager=tasks, random_seed=0,
        numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)


def _loglikelihoods(result: dict) -> dict[int, list[float]]:
    return {s["doc_id"]: [float(r[0][0]) for r in s["resps"]] for s in result["samples"][TASK]}


def test_local_completions_matches_the_hf_backend(server, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")  # nothing to download: no retries against the hub
    from engine.model_loader import resolve_model_path

    monkeypatch.chdir(Path(__file__).parents[2])  # the task's data path is repo-relative
    path = str(resolve_model_path(None))
    model = __import__("httpx").get(server.base_url + "/v1/models").json()["data"][0]["id"]
    served = _evaluate("local-completions", {
        "base_url": server.base_url + "/v1/completions", "model": model,
        "tokenizer_backend": "huggingface", "tokenizer": path, "tokenized_requests": True,
        "num_concurrent": 1, "max_retries": 1, "batch_size": 4})
    reference = _evaluate("hf", {"pretrained": path, "dtype": "float32", "device": "cpu",
                                 "batch_size": 4})
    ours, theirs = _loglikelihoods(served), _loglikelihoods(reference)
    assert ours.keys() == theirs.keys() and len(ours) == 12
    for doc_id, lls in theirs.items():
        assert len(ours[doc_id]) == len(lls) == 3
        for a, b in zip(ours[doc_id], lls):
            assert abs(a - b) < 1e-3, (doc_id, ours[doc_id], lls)
    assert served["results"][TASK]["acc,none"] == reference["results"][TASK]["acc,none"]
    assert scrape(server.base_url)['vllm:cache_config_info{block_size=16,'
                                   'enable_prefix_caching=True,gpu_memory_utilization=0.9,'
                                   'num_gpu_blocks=256}'] == 1
