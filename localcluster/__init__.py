"""The whole system on one machine: an emulated API server (kmock) faithful enough for
kubectl, the real operator, a process kubelet that runs pods as local processes, Prometheus
and PostgreSQL. `scripts/local-cluster up|down|status DIR`; docs/local-cluster.md."""
from .postgres import remove_postgres_data, start_postgres
from .prometheus import start_prometheus, write_targets

__all__ = ["start_prometheus", "write_targets", "start_postgres", "remove_postgres_data"]
