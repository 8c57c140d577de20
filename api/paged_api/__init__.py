"""The project's API, torch-free and importing nothing else of the project (kubebuilder's
`api/<version>/` is the model): everything the engine, the operator, the tuner and the load
tests must agree on, which each imports downward.

- settings.py (rows: settings_types.py, speculative decoding's: settings_speculative.py):
  the settings table, one row per engine setting with its flag, its place in a
  PagedInferenceService spec (spec.<section>.<field>), its rule and its tuning range;
- settings_k8s.py: spec.engine's and spec.kvCache's parsing and CRD schema, generated from
  the table (scripts/gen_crd_engine.py writes them into the chart);
- search_space.py: the search-space grammar over the table and the spec patch of a result;
- service.py: PagedInferenceService's spec parsed into a ServiceSpec, with its parts:
  model_source.py (spec.model), kv_cache.py (spec.kvCache, and the memory it adds),
  access.py (spec.router, networkPolicy, apiKeySecretRef), autoscaling.py
  (spec.autoscaling, the SLO planner's section), fields.py (the shared field readers and
  InvalidSpecError); the operator renders children from it, the planner reads it;
- contract.py: the API group, kinds, labels and annotations, and PagedInferenceTuning's
  spec parsed into a TuningSpec (the operator and the tuner Job read it alike);
- workloads.py: the workload names.
"""
