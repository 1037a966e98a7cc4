"""HTTP: which route a path is, and the request handler that dispatches it to the fake."""

from __future__ import annotations

import json
import logging
import re
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from agents.fakes.kube.certificates import CERTIFICATE_ROUTES
from agents.fakes.kube.dra import DRA_ROUTE_NAMES, DRA_ROUTES, serve_dra
from agents.fakes.kube.wire import (
    NAMESPACES,
    NODES,
    OWNER_KINDS,
    PODS,
    ApiError,
    KubeRequest,
    parse_field_selector,
    status_body,
)

if TYPE_CHECKING:
    from agents.fakes.kube.server import FakeKubernetes

log = logging.getLogger(__name__)

_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("pods", re.compile(r"^/api/v1/pods$")),
    ("namespaced_pods", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")),
    ("pod", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")),
    ("tokenreviews", re.compile(r"^/apis/authentication\.k8s\.io/v1/tokenreviews$")),
    ("eviction", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/eviction$")),
    ("core_events", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")),
    ("namespaces", re.compile(r"^/api/v1/namespaces$")),
    ("node", re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$")),
    ("namespace", re.compile(r"^/api/v1/namespaces/(?P<name>[^/]+)$")),
    ("events_v1", re.compile(r"^/apis/events\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/events$")),
    ("replicaset", re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/replicasets/(?P<name>[^/]+)$")),
    ("job", re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+)$")),
    *DRA_ROUTES,
]

_ROUTES.extend(CERTIFICATE_ROUTES)


def handler_for(fake: FakeKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked watch streams, as the API server

        def log_message(self, format: str, *args: Any) -> None:  # signature of BaseHTTPRequestHandler
            log.debug("fake kube-apiserver: " + format, *args)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def _serve(self, method: str) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            with fake._cond:
                fake.requests.append(KubeRequest(method=method, path=parsed.path, query=query))
            try:
                route, match = _route(parsed.path)
                body = json.loads(raw) if raw else {}
                status, payload = self._dispatch(method, route, match.groupdict(), query, body)
            except ApiError as error:
                status = error.code
                payload = status_body(
                    code=error.code, reason=error.reason, message=error.message, details=error.details
                )
            except json.JSONDecodeError as error:
                status = 400
                payload = status_body(code=400, reason="BadRequest", message=f"invalid JSON body: {error}")
            if payload is None:  # a watch stream, already written
                return
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _dispatch(  # noqa: PLR0912 - one branch per route the fake API server serves
            self, method: str, route: str, params: dict[str, str], query: dict[str, str], body: dict[str, Any]
        ) -> tuple[int, dict[str, Any] | None]:
            if route in {name for name, _ in CERTIFICATE_ROUTES}:
                return fake._serve_certificate_objects(method, route, params, body, self.headers.get("Content-Type", ""))
            watching = query.get("watch") in ("true", "1")
            if method == "POST" and route == "tokenreviews":
                return 201, fake._review_token(body)
            if method == "GET" and route in DRA_ROUTE_NAMES:
                return 200, serve_dra(fake, route, params, query, urllib.parse.urlsplit(self.path).path)
            if method == "GET" and route in ("pods", "namespaced_pods", "namespaces"):
                kind = {"pods": PODS, "namespaced_pods": PODS, "namespaces": NAMESPACES}[route]
                selector = parse_field_selector(
                    query.get("fieldSelector"), supported=set(kind.fields), resource=", ".join(sorted(kind.fields))
                )
                if query.get("labelSelector"):
                    raise ApiError(400, "BadRequest", "FakeKubernetes does not implement labelSelector")
                namespace = params.get("ns")
                if watching:
                    fake._watch(self, kind, namespace=namespace, selector=selector, query=query)
                    return 200, None
                return 200, fake._list(kind, namespace=namespace, selector=selector)
            if method == "GET" and route == "pod":
                return 200, fake._get(PODS, (params["ns"], params["name"]))
            if method == "GET" and route == "namespace":
                return 200, fake._get(NAMESPACES, ("", params["name"]))
            if method == "GET" and route == "node":
                return 200, fake._get(NODES, ("", params["name"]))
            if method == "GET" and route in OWNER_KINDS:
                kind = OWNER_KINDS[route]
                if fake.forbid_owner_reads:
                    raise ApiError(403, "Forbidden", f'{kind.resource} "{params["name"]}" is forbidden: '
                                    f'cannot get resource "{kind.resource}" in the namespace "{params["ns"]}"')
                return 200, fake._get(kind, (params["ns"], params["name"]))
            if method == "PATCH" and route == "node":
                return 200, fake._patch_node(params["name"], body, self.headers.get("Content-Type", ""))
            if method == "POST" and route == "eviction":
                return 201, fake._evict(params["ns"], params["name"], body)
            if method == "POST" and route == "core_events":
                return 201, fake._create_event(params["ns"], body, api_version="v1")
            if method == "POST" and route == "events_v1":
                return 201, fake._create_event(params["ns"], body, api_version="events.k8s.io/v1")
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {route}")

    return Handler


def _route(path: str) -> tuple[str, re.Match[str]]:
    for name, pattern in _ROUTES:
        match = pattern.match(path)
        if match is not None:
            return name, match
    raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
