"""What the SLO planner exports on its /metrics (`python -m tuner plan --metrics-port`),
for the dashboard's planner row (charts/.../dashboards/paged-inference.json) beside the
engines' series: each decision's inputs and outcome, labelled by the service it plans.
The same decision is the service's status.planner and an Event (run.py); these make its
history a graph."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from tuner.planner.core import Decision

OUTCOMES = ("scaled", "kept", "held")


class PlannerMetrics:
    def __init__(self, namespace: str, name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ("namespace", "service")
        self._values = (namespace, name)

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(metric, doc, labels, registry=self.registry)
        self.replicas = gauge("paged_planner_replicas", "Replicas the last decision set.")
        self.wanted = gauge("paged_planner_wanted_replicas",
                            "Replicas the forecast needs, before the bounds and the "
                            "scale-down stabilisation.")
        self.rate = gauge("paged_planner_arrival_rate",
                          "Requests/s that arrived over the last observation window.")
        self.forecast = gauge("paged_planner_forecast_rate",
                              "Requests/s the planner provisions the next interval for.")
        self.capacity = gauge("paged_planner_replica_capacity",
                              "One replica's SLO capacity at the current mix, req/s: the "
                              "simulator's prediction times the correction.")
        self.correction = gauge("paged_planner_correction",
                                "Observed over predicted inter-token latency, smoothed; the "
                                "predicted capacity is divided by it (1: as predicted).")
        self.decisions = Counter("paged_planner_decisions", "Decisions by outcome.",
                                 (*labels, "outcome"), registry=self.registry)
        for outcome in OUTCOMES:   # every outcome's series exists from the start
            self.decisions.labels(*self._values, outcome)

    def record(self, decision: Decision, previous: int) -> None:
        held = decision.reason.startswith("unchanged: ")
        outcome = "held" if held else "scaled" if decision.replicas != previous else "kept"
        self.decisions.labels(*self._values, outcome).inc()
        self.replicas.labels(*self._values).set(decision.replicas)
        for gauge, value in ((self.wanted, decision.wanted), (self.rate, decision.rate),
                             (self.forecast, decision.forecast),
                             (self.capacity, decision.corrected_capacity),
                             (self.correction, decision.correction)):
            if value is not None:   # a held decision observed nothing: the last value stays
                gauge.labels(*self._values).set(value)
