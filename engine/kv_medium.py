"""Where a KV block lives: the one name of each medium, for the cache manager, the tiers,
the KV events on the wire and the router's index (torch-free: the router imports it).

A StrEnum: each member is its wire string (vLLM's "GPU", "CPU" and our "Disk"), so events,
metrics labels and JSON carry it unchanged, and a string from the wire compares equal.
"""
from __future__ import annotations

import enum


class Medium(enum.StrEnum):
    GPU = "GPU"     # the device pool (also the medium of an event that names none)
    CPU = "CPU"     # the host tier
    DISK = "Disk"   # the shared disk tier
