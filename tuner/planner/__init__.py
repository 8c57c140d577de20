"""The SLO planner: replicas from the traffic, the profile and the simulator (docs/planner.md)."""
