"""Content negotiation, as kube-apiserver does it: request bodies in protobuf decoded
(protobuf.py); answers in protobuf (protobuf_encode.py) when the client prefers it and the
object is a built-in kind with a protobuf table entry, JSON otherwise.

The Accept header's media ranges are ranked as Go's goautoneg ranks them (q-value first,
then the more specific range, then the order given); the first range the server can answer
wins: `application/vnd.kubernetes.protobuf` (protobuf), `application/json`, `application/*`
or `*/*` (JSON, the server's default). A range with `as=` (Table, PartialObjectMetadata)
is left to the Table code, which answers JSON; an Accept header naming nothing the server
knows gets JSON. Custom resources have no protobuf form: a client that accepts nothing
else gets 406, as from a real server, and one that also accepts JSON gets JSON.
"""
from __future__ import annotations

import collections
from typing import Any

import aiohttp.web
import multidict

from . import protobuf, protobuf_encode
from .protobuf import CONTENT_TYPE as PROTOBUF
from .writes import ApiError

JSON = "application/json"
WATCH_PROTOBUF = PROTOBUF + ";stream=watch"
_JSON_RANGES = {JSON, "application/*", "*/*"}


def _ranges(accept: str) -> list[tuple[str, dict[str, str], float, int]]:
    out = []
    for index, part in enumerate(accept.split(",")):
        mime, *params = [p.strip() for p in part.split(";")]
        if not mime:
            continue
        named = dict(p.partition("=")[::2] for p in params if "=" in p)
        try:
            q = float(named.pop("q", "1"))
        except ValueError:
            q = 0.0   # a range with an unreadable q-value is not acceptable
        named.pop("stream", None)   # `;stream=watch`: the same serializer
        out.append((mime.lower(), named, q, index))
    out.sort(key=lambda r: (-r[2], r[0].count("*"), r[3]))
    return [r for r in out if r[2] > 0]


def choice(accept: str | None) -> str:
    """PROTOBUF or JSON: the most preferred answer the client accepts (JSON by default)."""
    for mime, params, _, _ in _ranges(accept or ""):
        if mime == PROTOBUF and "as" not in params:
            return PROTOBUF
        if mime in _JSON_RANGES:   # `as=Table` too: the Table code answers JSON
            return JSON
    return JSON   # nothing the server knows (application/yaml): JSON, as before


def _takes_json(accept: str | None) -> bool:
    return any(mime in _JSON_RANGES for mime, *_ in _ranges(accept or ""))


def wants_protobuf(accept: str | None, obj: dict[str, Any]) -> bool:
    """Whether to answer `obj` in protobuf. A kind without a protobuf form (a custom
    resource) asked for in protobuf only: ApiError 406, as from a real server."""
    if choice(accept) != PROTOBUF:
        return False
    if protobuf_encode.message_for(obj) is not None:
        return True
    if not _takes_json(accept):
        raise ApiError(406, "NotAcceptable", "only the following media types are accepted "
                       f"for {obj.get('apiVersion')} {obj.get('kind')}: {JSON}")
    return False


def request_data(content_type: str | None, method: str, body: bytes, data: Any) -> Any:
    """The request's object: its protobuf body decoded, or the JSON one as parsed."""
    if content_type == PROTOBUF and method in ("POST", "PUT", "DELETE") and body:
        try:
            return protobuf.decode(body)
        except protobuf.ProtobufError as e:
            raise ApiError(400, "BadRequest", f"the protobuf body cannot be decoded: {e}")
    if "protobuf" in (content_type or "") or "cbor" in (content_type or ""):
        raise ApiError(415, "UnsupportedMediaType", f"the body's content type "
                       f"{content_type} is not supported for {method}: send JSON")
    return data


class Responder:
    """Builds the answers and counts them by content type (the server's /metrics)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def answer(self, accept: str | None, body: Any, status: int = 200,
               headers: multidict.CIMultiDict | None = None) -> aiohttp.web.Response:
        if isinstance(body, dict) and wants_protobuf(accept, body):
            try:
                data = protobuf_encode.encode(body)
            except protobuf.ProtobufError as e:   # a stored value its field cannot hold
                if not _takes_json(accept):
                    raise ApiError(500, "InternalError", f"the answer cannot be written in "
                                   f"protobuf ({e}): accept application/json too") from None
                self.counts["fallback"] += 1   # JSON, which the client accepts too
            else:
                self.counts[PROTOBUF] += 1
                return aiohttp.web.Response(body=data, status=status, headers=headers,
                                            content_type=PROTOBUF)
        self.counts[JSON] += 1
        return aiohttp.web.json_response(body, status=status, headers=headers)

    def error(self, accept: str | None, body: dict[str, Any], status: int):
        """A Status error, in protobuf if asked; JSON when the Accept header is unusable."""
        try:
            return self.answer(accept, body, status)
        except ApiError:
            self.counts[JSON] += 1
            return aiohttp.web.json_response(body, status=status)

    def metrics(self) -> aiohttp.web.Response:
        lines = ["# TYPE localcluster_api_responses_total counter"] + [
            f'localcluster_api_responses_total{{content_type="{ct}"}} {n}'
            for ct, n in sorted(self.counts.items())]
        return aiohttp.web.Response(text="\n".join(lines) + "\n")
