"""Several tuner pods on one study (spec.tunerPods), without a cluster: two Tuning searches
in threads share a study; their trials add up to spec.trials, none measured twice, each
recorded with its pod in status.history (built from the study, so either pod's publish
holds both pods' trials); the lead (pod 0) waits for the other pod's trial before it
returns (to confirm), the other publishes no phase and leaves once nothing is left to ask;
a trial of a pod that died is failed by the lead once it has run too long."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import optuna

from tuner.search import study as st
from tuner.incluster.job import Tuning
from paged_api.contract import search_space


def tuning(pod: str, out_dir: Path, log: list, seconds: float = 0.1) -> Tuning:
    run = object.__new__(Tuning)
    run.name, run.pod, run.out_dir, run.status = "tune", pod, out_dir, {}
    run.spec = SimpleNamespace(space=search_space({"maxNumSeqs": [4, 8, 16, 32]}), trials=4,
                               parallelism=1, seed=0, startup_timeout=60.0, duration=1.0)
    run.published = []
    run.publish = lambda **fields: (run.published.append(fields), run.status.update(fields))

    class Runner:   # a TrialRunner (tuner/measure/runner.py) standing in for trial services
        def run(self, request) -> dict:
            number = int(request.name.removeprefix("trial-"))
            time.sleep(seconds)
            log.append((pod, number, time.monotonic()))
            return {"goodput": float(request.settings["max_num_seqs"]), "ttft_p99": 0.1,
                    "requests": 10}
    run.runner = Runner()
    return run


def open_shared(path: Path) -> optuna.Study:
    return st.open_study(storage=f"sqlite:///{path}", study_name="shared",
                         objective="goodput", seed=0, n_startup_trials=2)


def test_two_pods_share_the_search_and_the_lead_waits_for_the_other(tmp_path: Path) -> None:
    log: list = []
    lead = tuning("tune-tuner-0-abc", tmp_path, log, seconds=0.4)
    other = tuning("tune-tuner-1-def", tmp_path, log, seconds=1.5)   # the lead waits for it
    db = tmp_path / "study.db"
    studies = [open_shared(db), open_shared(db)]
    ended = {}

    def run(pod: Tuning, study: optuna.Study, is_lead: bool) -> None:
        pod.search(study, index=0 if is_lead else 1)
        ended[pod.pod] = time.monotonic()
    threads = [threading.Thread(target=run, args=(lead, studies[0], True)),
               threading.Thread(target=run, args=(other, studies[1], False))]
    threads[0].start()
    time.sleep(0.2)   # the lead queues the grid; the other pod waits for it
    threads[1].start()
    for thread in threads:
        thread.join(60)
    # two pods that count, then ask, can race past the total: such a trial is "surplus"
    trials = [t for t in studies[0].get_trials() if not t.user_attrs.get("surplus")]
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    assert sorted(t.params["max_num_seqs"] for t in trials) == [4, 8, 16, 32]   # none twice
    pods = {pod for pod, _, _ in log}
    assert pods == {lead.pod, other.pod}, log
    history = lead.status["history"]
    assert [e["trial"] for e in history] == [0, 1, 2, 3]
    assert {e["pod"] for e in history} == pods
    assert {e["trial"]: e["pod"] for e in history} == {n: p for p, n, _ in log}
    # the lead returned after the other pod's last trial; the other published no phase
    assert ended[lead.pod] >= max(t for p, _, t in log if p == other.pod)
    assert all("phase" not in fields for fields in other.published)
    assert lead.published[0]["phase"] == "Searching"


def test_the_lead_fails_a_trial_whose_pod_died(tmp_path: Path) -> None:
    study = open_shared(tmp_path / "study.db")
    lead = tuning("tune-tuner-0-abc", tmp_path, [])
    lead.spec.trials = 1
    dead = study.ask()   # another pod's trial, left RUNNING: its pod is gone
    dead.suggest_categorical("max_num_seqs", [4, 8, 16, 32])
    lead.spec.startup_timeout = -400.0   # the limit (timeout + 3 x duration + 300 s) passed
    lead.search(study, index=0)
    assert [t.state.name for t in study.get_trials()] == ["FAIL"]
    assert lead.status["trialsText"] == "1/1"


def test_a_trial_asked_past_the_total_is_beyond_it(tmp_path: Path) -> None:
    study = open_shared(tmp_path / "study.db")
    for value in (4, 8):
        study.enqueue_trial({"max_num_seqs": value})
    first, second = study.ask(), study.ask()   # the two queued ones
    third = study.ask()                        # a racing pod's: past a total of 2
    assert not st.beyond_total(study, first.number, 2)
    assert not st.beyond_total(study, second.number, 2)
    assert st.beyond_total(study, third.number, 2)
    third.set_user_attr("surplus", True)
    study.tell(third, state=optuna.trial.TrialState.FAIL)
    study.tell(first, 1.0)
    assert st.search_trials_done(study) == 1   # the surplus trial counts nowhere


def test_a_restarted_pod_fails_what_its_predecessor_left_running(tmp_path: Path) -> None:
    """The Job restarts a killed pod at its index: its old trial is failed at once (not
    after the long limit) and its trial service deleted; the search goes on."""
    study = open_shared(tmp_path / "study.db")
    lead = tuning("tune-tuner-0-new", tmp_path, [])
    lead.spec.trials = 2
    deleted: list[str] = []
    lead.cluster = SimpleNamespace(delete_service=deleted.append)
    killed = study.ask()
    killed.suggest_categorical("max_num_seqs", [4, 8, 16, 32])
    killed.set_user_attr("tunerIndex", 0)
    lead.search(study, index=0)
    assert deleted == [f"tune-t{killed.number}"]
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states[killed.number] == "FAIL" and lead.status["trialsText"] == "2/2"
