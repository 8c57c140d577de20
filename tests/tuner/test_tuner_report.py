"""The spec.engine patch: schema validation, and the winner's choice under noise."""
import optuna
import pytest
import yaml

from tuner.search import study as st
from tuner.search.confirm import Baseline, candidates
from tuner.search.report import CRD_PATH, best_table, engine_patch, validate_patch

CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "spec": {"versions": [{"name": "v1alpha1", "schema": {"openAPIV3Schema": {
           "type": "object", "properties": {"spec": {"type": "object", "properties": {
               "engine": {"type": "object", "additionalProperties": False, "properties": {
                   "blockSize": {"type": "integer", "enum": [8, 16, 32]},
                   "gpuMemoryUtilization": {"type": "number", "minimum": 0,
                                            "exclusiveMinimum": True, "maximum": 1},
                   "maxNumSeqs": {"type": "integer", "minimum": 1}}}}}}}}}]}}


@pytest.fixture
def crd(tmp_path):
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(CRD))
    return path


def test_validation_against_a_crd_names_the_bad_field(crd, tmp_path):
    good = {"spec": {"engine": {"blockSize": 16, "gpuMemoryUtilization": 0.9, "maxNumSeqs": 4}}}
    assert validate_patch(good, crd_path=crd) is True
    for engine, words in (({"blockSize": 12}, "blockSize"),
                          ({"gpuMemoryUtilization": 0.0}, "gpuMemoryUtilization"),
                          ({"maxNumSeqs": "4"}, "maxNumSeqs"),
                          ({"pageSize": 4}, "pageSize")):
        with pytest.raises(ValueError, match=words):
            validate_patch({"spec": {"engine": engine}}, crd_path=crd)
    assert validate_patch(good, crd_path=tmp_path / "absent.yaml") is False


@pytest.mark.skipif(not CRD_PATH.is_file(), reason="the chart's CRD is not in this checkout")
def test_the_charts_crd_accepts_tuner_output_and_rejects_its_cel_rule():
    validate_patch({"spec": {"engine": {"blockSize": 128, "gpuMemoryUtilization": 0.95,
                                        "maxNumSeqs": 64, "maxNumBatchedTokens": 8192}}})
    with pytest.raises(ValueError, match="maxNumBatchedTokens"):
        validate_patch({"spec": {"engine": {"maxNumSeqs": 64, "maxNumBatchedTokens": 32}}})


def _study(records):
    study = optuna.create_study(direction="maximize")
    for params, goodput, extra in records:
        trial = optuna.trial.create_trial(
            params=params, value=goodput, user_attrs={"goodput": goodput, **extra},
            distributions={k: optuna.distributions.CategoricalDistribution([1, 2, 4, 8, 16])
                           for k in params})
        study.add_trial(trial)
    return study


def test_search_best_is_the_best_mean_and_infeasible_never_wins():
    study = _study([({"max_num_seqs": 1}, 5.0, {}),                      # lucky once ...
                    ({"max_num_seqs": 1}, 1.0, {}),                      # ... mean 3.0
                    ({"max_num_seqs": 4}, 4.0, {}),
                    ({"max_num_seqs": 4}, 3.6, {}),                      # mean 3.8
                    ({"max_num_seqs": 8}, 9.0, {"infeasible": "out of memory"})])
    best = st.best_group(study)
    assert best["params"] == {"max_num_seqs": 4} and best["measurements"] == 2
    assert best["goodput"] == pytest.approx(3.8)
    study.set_user_attr("config", {"fixed": {"block_size": 16}})
    assert engine_patch(study) == {"spec": {"engine": {"blockSize": 16, "maxNumSeqs": 4}}}
    assert "1 infeasible" in best_table(study)
    # candidates for the confirmation: the best k, never the baseline itself
    extra = _study([({"max_num_seqs": 2}, 6.0, {}), ({"max_num_seqs": 16}, 2.0, {}),
                    ({"max_num_seqs": 8}, 9.0, {"infeasible": "out of memory"})])
    baseline = Baseline({"max_num_seqs": 2, "block_size": 16}, {}, "engine defaults")
    assert [g["params"] for g in candidates(extra, 2, baseline)] == [{"max_num_seqs": 16}]
