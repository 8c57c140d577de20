"""The Helm chart with the real helm binary: lint, render, validate, reject bad values."""
from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from chart_tools import CHART, crd, helm, render, validate_k8s
from paged_operator.manifests_planner import planner_role
from paged_api.service import parse_spec


def by_kind(docs):
    out = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def test_helm_lint_strict_is_clean():
    proc = helm("lint", "--strict", str(CHART))
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_default_render_validates_and_watches_only_its_own_namespace():
    docs = render(include_crds=True)
    for doc in docs:
        if doc["apiVersion"] != "kopf.dev/v1":   # a custom resource: no upstream schema
            validate_k8s(doc)
    kinds = by_kind(docs)
    # Least privilege by default: nothing cluster-wide.
    assert sorted(kinds) == ["CustomResourceDefinition", "Deployment", "KopfPeering", "Role",
                             "RoleBinding", "ServiceAccount"]
    assert crd() in kinds["CustomResourceDefinition"]
    assert {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"} <= {
        c["metadata"]["name"] for c in kinds["CustomResourceDefinition"]}
    deployment = kinds["Deployment"][0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # Two replicas peering (kopf): one handles resources, the other takes over; a rolling
    # update keeps one running throughout.
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    [peering] = kinds["KopfPeering"]
    assert peering["metadata"]["namespace"] == "inference"
    env = {e["name"]: e.get("value") or e["valueFrom"] for e in container["env"]}
    assert env["PAGED_OPERATOR_PEERING"] == peering["metadata"]["name"]
    assert env["PAGED_OPERATOR_PEERING_LIFETIME"] == "15"
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}   # kopf's identity
    assert container["image"] == "pagedinference/operator:0.1.0"
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert [a for a in container["args"] if a.startswith("--namespace")] == [
        "--namespace=inference"]
    assert [r["metadata"]["namespace"] for r in kinds["Role"]] == ["inference"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["limits"]["memory"] == "256Mi"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == kinds["ServiceAccount"][0]["metadata"]["name"]
    binding = kinds["RoleBinding"][0]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "namespace": "inference",
                                    "name": pod["serviceAccountName"]}]
    assert env["PAGED_OPERATOR_ENGINE_IMAGE"] == "pagedinference/engine:0.1.0"


def test_cluster_wide_is_a_switch_and_excludes_a_namespace_list():
    kinds = by_kind(render("clusterWide=true"))
    assert sorted(kinds) == ["ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding",
                             "Deployment", "ServiceAccount"]
    assert {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"],
            "verbs": ["get", "list", "watch", "patch"]} in kinds["ClusterRole"][0]["rules"]
    container = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert not any(a.startswith("--namespace") for a in container["args"])
    binding = kinds["ClusterRoleBinding"][0]
    assert binding["subjects"][0]["namespace"] == "inference"
    proc = helm("template", "pio", str(CHART), "--set", "clusterWide=true",
                "--set", "watchNamespaces={a}", check=False)
    assert proc.returncode != 0 and "not both" in proc.stderr


def test_rbac_is_minimal_and_has_no_wildcards():
    rules = by_kind(render())["Role"][0]["rules"]
    cluster_rules = by_kind(render("clusterWide=true"))["ClusterRole"][0]["rules"]
    # the same, but for the peering objects' scope
    assert [r for r in rules if r["apiGroups"] != ["kopf.dev"]] == [
        r for r in cluster_rules if r["apiGroups"] != ["kopf.dev"]]
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
    granted = {(g, r): set(rule["verbs"]) for rule in rules
               for g in rule["apiGroups"] for r in rule["resources"]}
    # create/delete: the tuner Job's Role grants them for trial services (PagedInferenceTuning)
    assert granted[("serving.pagedinference.dev", "pagedinferenceservices")] == {
        "get", "list", "watch", "patch", "create", "delete"}
    # delete: the router's Deployment when spec.router is turned off and a finished
    # tuning's load workers (the engine's goes with its owner, by garbage collection)
    assert granted[("apps", "deployments")] == {"get", "list", "watch", "create", "patch",
                                                "delete"}
    assert granted[("", "events")] == {"create", "patch"}   # patch: the planner's, below
    assert granted[("kopf.dev", "kopfpeerings")] == {"get", "list", "watch", "patch"}
    assert granted[("", "pods")] == {"get", "list", "watch"}  # engine errors, read-only
    # What the router's Role grants, the operator must hold (RBAC escalation check).
    assert granted[("discovery.k8s.io", "endpointslices")] == {"get", "list", "watch"}
    assert granted[("rbac.authorization.k8s.io", "roles")] == {"get", "create", "patch",
                                                               "delete"}
    assert granted[("networking.k8s.io", "networkpolicies")] == {"get", "create", "patch",
                                                                 "delete"}
    # the SLO planner's Role (spec.autoscaling.mode slo): the operator creates it, so holds it
    planner = planner_role(parse_spec({"model": {"uri": "hf://m"}, "autoscaling": {
        "mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 1}}}, name="s", namespace="n"))
    for rule in planner["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert set(rule["verbs"]) <= granted.get((group, resource), set()), rule
    assert not any(r == "secrets" for _, r in granted)  # mounted by the kubelet, never read
    assert not any(r in ("clusterroles", "clusterrolebindings") for _, r in granted)


def test_non_default_values_render_namespaced_rbac(tmp_path):
    values = {"watchNamespaces": ["team-a", "team-b"], "image": {
        "repository": "registry.example/pio", "tag": "1.2.3", "pullPolicy": "Always"},
        "serviceAccount": {"create": False, "name": "existing-sa"},
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}},
        "verbose": True, "logFormat": "json", "resyncSeconds": 15, "healthPort": 9090,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "control", "operator": "Exists"}],
        "engineImage": "registry.example/engine:9", "podLabels": {"team": "ml"},
        "replicaCount": 1}
    docs = render(values=values, tmp_path=tmp_path)
    for doc in docs:
        validate_k8s(doc)
    kinds = by_kind(docs)
    assert "ClusterRole" not in kinds and "ServiceAccount" not in kinds
    assert "KopfPeering" not in kinds   # one replica runs standalone, replaced by Recreate
    assert kinds["Deployment"][0]["spec"]["strategy"] == {"type": "Recreate"}
    assert not any(r["apiGroups"] == ["kopf.dev"] for r in kinds["Role"][0]["rules"])
    assert sorted(r["metadata"]["namespace"] for r in kinds["Role"]) == ["team-a", "team-b"]
    assert all(b["subjects"][0]["name"] == "existing-sa" for b in kinds["RoleBinding"])
    container = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/pio:1.2.3"
    assert container["args"] == ["--liveness=http://0.0.0.0:9090/healthz", "--log-format=json",
                                 "--verbose", "--namespace=team-a", "--namespace=team-b"]
    assert container["ports"][0]["containerPort"] == 9090
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"PAGED_OPERATOR_ENGINE_IMAGE": "registry.example/engine:9",
                   "PAGED_OPERATOR_RESYNC_SECONDS": "15"}


@pytest.mark.parametrize("bad", [
    "healthPort=80", "logFormat=xml", "resyncSeconds=0", "image.pullPolicy=Sometimes",
    "watchNamespaces[0]=Not_A_Namespace", "resources.limits.memory=lots", "unknownKey=1",
    "replicaCount=0", "peering.lifetimeSeconds=4", "peering.other=1",
])
def test_values_violating_the_schema_are_rejected(bad):
    proc = helm("template", "pio", str(CHART), "--set", bad, check=False)
    assert proc.returncode != 0, f"helm accepted {bad}"
    assert "schema" in proc.stderr.lower(), proc.stderr


def test_notes_say_what_to_apply_next():
    proc = helm("install", "pio", str(CHART), "--dry-run=client", "--namespace", "inference")
    assert "kubectl apply -f examples/service.yaml" in proc.stdout
    assert "kubectl get pis" in proc.stdout


def test_the_kubernetes_validator_is_not_vacuous():
    deployment = by_kind(render())["Deployment"][0]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(broken)


def test_the_operator_holds_every_permission_it_grants_the_router():
    """RBAC refuses to create a Role granting more than its creator holds."""
    from paged_operator import manifests_access
    from paged_api.service import parse_spec

    rules = by_kind(render())["Role"][0]["rules"]
    granted = {(g, r): set(rule["verbs"]) for rule in rules
               for g in rule["apiGroups"] for r in rule["resources"]}
    spec = parse_spec({"model": {"uri": "a/b"}, "router": {"enabled": True}},
                      name="svc", namespace="inference")
    for rule in manifests_access.router_role(spec)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert set(rule["verbs"]) <= granted[(group, resource)], (group, resource)
