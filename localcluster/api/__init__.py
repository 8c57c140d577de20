"""The emulated Kubernetes API server of the local cluster (kmock underneath)."""
from .server import ApiServer

__all__ = ["ApiServer"]
