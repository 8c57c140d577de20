"""spec.model: where the engine gets its weights, and the name clients ask for.

Four forms of spec.model.uri:
- `org/name` or `hf://org/name`: a Hugging Face id, downloaded into HF_HOME;
- `pvc://<claim>/<path>`: weights on a PersistentVolumeClaim, mounted read-only;
- `/abs/path`: weights baked into the image;
- `builtin://<name>`: a model the engine ships (`builtin://default` is the tiny embedded one),
  passed to the engine unchanged; nothing is downloaded or mounted.
"""
from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from paged_api.fields import DNS_SUBDOMAIN, InvalidSpecError, get_field

BUILTIN_PREFIX = "builtin://"
MODEL_DIR = "/mnt/model"   # where the engine container mounts a pvc:// model's claim
# A lower-case DNS-ish name: "default", "smollm2-135m-instruct", "qwen2.5-0.5b".
BUILTIN_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)?$")
FORMS = ("a Hugging Face id (org/name), pvc://<claim>/<path>, an absolute path in the image "
         "or builtin://<name>")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSource:
    uri: str
    served_name: str
    kind: str                     # "hf" | "pvc" | "path" | "builtin"
    claim_name: str | None = None  # pvc only
    path_in_claim: str = ""        # pvc only, "" = the claim's root

    @property
    def engine_arg(self) -> str:
        """The model as the engine (and the precise router's --tokenizer) is given it:
        builtin://NAME as it is (the engine knows its own models), a claim's path where
        the pod mounts it."""
        if self.kind == "pvc":
            return f"{MODEL_DIR}/{self.path_in_claim}".rstrip("/")
        return self.uri


def _no_parent_segments(uri: str, path: str) -> None:
    """'..' would leave the claim or the intended directory; `%2e%2e` is the same thing to
    whatever decodes the path later, so decode first (repeatedly: `%252e` decodes twice)."""
    decoded, previous = path, None
    while decoded != previous:
        previous, decoded = decoded, urllib.parse.unquote(decoded)
    if ".." in re.split(r"[/\\]", decoded):
        raise InvalidSpecError(f"spec.model.uri {uri!r} must not contain '..' path segments "
                               "(also when percent-encoded)")


def parse_model(model: Mapping[str, Any], *, default_name: str) -> ModelSource:
    uri = get_field(model, "uri", "model.", str)
    if not uri:
        raise InvalidSpecError(f"spec.model.uri is required: {FORMS}")
    served = get_field(model, "servedName", "model.", str, default_name) or default_name
    if uri.startswith(BUILTIN_PREFIX):
        name = uri[len(BUILTIN_PREFIX):]
        if not BUILTIN_NAME.match(name):
            raise InvalidSpecError(f"spec.model.uri {uri!r}: the name after builtin:// must be "
                                   "lower-case letters, digits, '-' and '.', as in "
                                   "builtin://default")
        return ModelSource(uri=uri, served_name=served, kind="builtin")
    if uri.startswith("pvc://"):
        claim, _, path = uri[len("pvc://"):].partition("/")
        if not DNS_SUBDOMAIN.match(claim):
            raise InvalidSpecError(f"spec.model.uri {uri!r}: the claim name after pvc:// "
                                   "must be a lower-case DNS name, as in pvc://models/llama")
        _no_parent_segments(uri, path)
        return ModelSource(uri=uri, served_name=served, kind="pvc", claim_name=claim,
                           path_in_claim=path.strip("/"))
    if uri.startswith("/"):
        if re.search(r"\s", uri):
            raise InvalidSpecError(f"spec.model.uri {uri!r} must not contain whitespace")
        _no_parent_segments(uri, uri)
        return ModelSource(uri=uri, served_name=served, kind="path")
    hf_id = uri.removeprefix("hf://")
    if not HF_ID.match(hf_id):
        raise InvalidSpecError(f"spec.model.uri {uri!r} is none of {FORMS}")
    _no_parent_segments(uri, hf_id)
    return ModelSource(uri=hf_id, served_name=served, kind="hf")
