"""The demo's "OpenCost port": OpenCost's clients read `make demo` with no credential.

kubectl-cost and the OpenCost UI send no `Authorization`; in a cluster they go through the
OpenCost gateway (deploy/k8s/opencost-clients.yaml), which adds a ServiceAccount token. The demo
runs no API server to review one, so this is the same proxy that injects an identity, for a
machine with no cluster: on loopback only, it forwards GET (and HEAD) of OpenCost's read paths
to the demo's web server with a finance API token the demo issued at start (kept in memory,
never written anywhere). Any other path is 404 and any other method 405, as the gateway refuses.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["DEFAULT_PORT", "READ_PATH", "OpenCostPort", "port_from_env"]

# OpenCost's own port, so a client's default `--opencost` address and the UI's API_PORT need no change.
DEFAULT_PORT = 9003
# The gateway's nginx location, character for character: the allocation and asset reads, with
# or without Kubecost's /model prefix (the ledger serves both).
READ_PATH = re.compile(r"^(?:/model)?(?:/allocation(?:/compute)?(?:/summary)?|/allocation/autocomplete|/assets)$")
# What a client may tell the ledger; everything else (cookies, its own Authorization) is dropped.
FORWARDED_REQUEST_HEADERS = ("Accept", "Accept-Language")
FORWARDED_RESPONSE_HEADERS = ("Content-Type", "Content-Language", "Retry-After")
UPSTREAM_TIMEOUT_S = 120


def port_from_env(value: str | None) -> int:
    """VGPU_DEMO_OPENCOST_PORT: unset is OpenCost's 9003, 0 is off; anything else must be a port."""
    if value is None or not value.strip():
        return DEFAULT_PORT
    port = int(value)
    if not 0 <= port <= 65535:
        raise ValueError(f"VGPU_DEMO_OPENCOST_PORT must be 0 (off) to 65535, not {port}")
    return port


class OpenCostPort:
    """A read-only reverse proxy on 127.0.0.1:`port` to `upstream` as the holder of `token`."""

    def __init__(self, *, upstream: str, token: str, port: int) -> None:
        self.upstream, self.token = upstream.rstrip("/"), token
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="opencost-port").start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _forward(self, path: str, query: str, headers: dict[str, str], method: str) -> tuple[int, dict[str, str], bytes]:
        url = f"{self.upstream}{path}" + (f"?{query}" if query else "")
        sent = {name: headers[name] for name in FORWARDED_REQUEST_HEADERS if name in headers}
        sent["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, headers=sent, method=method)  # noqa: S310 - our own loopback URL
        try:
            with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT_S) as resp:  # noqa: S310 - as above
                return resp.status, dict(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as exc:
            # The ledger's own refusal (a 400 naming the parameter, a 503) reaches the client as it is.
            return exc.code, dict(exc.headers.items()), exc.read()
        except (OSError, TimeoutError) as exc:
            return 502, {"Content-Type": "text/plain; charset=utf-8"}, f"demo web server unreachable: {exc}\n".encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        port = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, headers: dict[str, str], body: bytes, *, head: bool = False) -> None:
                self.send_response(status)
                for name in FORWARDED_RESPONSE_HEADERS:
                    if name in headers:
                        self.send_header(name, headers[name])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _read(self, *, head: bool) -> None:
                path, _, query = self.path.partition("?")
                if not READ_PATH.match(path):
                    self._reply(404, {"Content-Type": "text/plain; charset=utf-8"},
                                b"not served by the vGPU Ledger demo's OpenCost port\n", head=head)
                    return
                status, headers, body = port._forward(path, query, dict(self.headers.items()),
                                                      "HEAD" if head else "GET")
                self._reply(status, headers, body, head=head)

            def do_GET(self) -> None:
                self._read(head=False)

            def do_HEAD(self) -> None:
                self._read(head=True)

            def _refuse(self) -> None:
                # Read-only: the token is finance's, and nothing through this port may change the ledger.
                self.send_response(405)
                self.send_header("Allow", "GET, HEAD")
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                body = b"the demo's OpenCost port only reads (GET)\n"
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _refuse  # noqa: N815 - http.server's naming

            def log_message(self, *args: object) -> None:
                pass

        return Handler
