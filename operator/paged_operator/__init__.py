"""Kubernetes operator for PagedInferenceService (serving.pagedinference.dev/v1alpha1).

Importing the package registers the kopf handlers, so `kopf run -m paged_operator`
works; `python -m paged_operator` adds the liveness endpoint and namespace options.
"""
from . import handlers
from . import tuning  # noqa: F401,E402  (PagedInferenceTuning handlers)
from paged_api.contract import GROUP, VERSION
from paged_api.contract import SERVICE_KIND as KIND
from paged_api.contract import SERVICE_PLURAL as PLURAL
from paged_api.service import InvalidSpecError, ServiceSpec, parse_spec

__all__ = ["GROUP", "KIND", "PLURAL", "VERSION", "InvalidSpecError", "ServiceSpec",
           "handlers", "parse_spec"]
