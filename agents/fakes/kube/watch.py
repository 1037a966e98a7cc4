"""Watches: chunked streams of ADDED / MODIFIED / DELETED events, BOOKMARKs, compaction's
410, and a test's means to cut them off."""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from agents.fakes.kube.store import Store
from agents.fakes.kube.wire import ApiError, Change, Kind, Selector, status_body


class Watches(Store):
    """Watch streams over the store's change history, and the switches a test cuts them with."""

    def __init__(self) -> None:
        super().__init__()
        self._watch_generation = 0
        self._watches_held = False
        self._active_watches = 0
        self._closing = False

    def compact(self) -> None:
        """Drop the change history, as etcd compaction does: older watches get 410 Gone."""
        with self._cond:
            self._resource_version += 1
            self._compacted_rv = self._resource_version
            self._history.clear()

    @contextlib.contextmanager
    def watches_held(self) -> Iterator[None]:
        """End every open watch stream and hold new watch requests until the block exits.

        Models a client cut off from the API server: changes made inside the block (and a
        ``compact()``) are what the client must recover when it reconnects.
        """
        with self._cond:
            self._watches_held = True
            self._watch_generation += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._watches_held = False
                self._cond.notify_all()

    def wait_for_watches(self, count: int, *, timeout_s: float = 5.0) -> None:
        """Block until ``count`` watch streams are open (a test's sync point)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._active_watches >= count, timeout=timeout_s):
                raise TimeoutError(f"{self._active_watches} watch streams open after {timeout_s} s, wanted {count}")

    def _watch(
        self,
        handler: BaseHTTPRequestHandler,
        kind: Kind,
        *,
        namespace: str | None,
        selector: Selector,
        query: dict[str, str],
    ) -> None:
        timeout_s = float(query.get("timeoutSeconds", "1800"))
        deadline = time.monotonic() + timeout_s
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        requested = query.get("resourceVersion", "")
        with self._cond:
            self._cond.wait_for(lambda: not self._watches_held or self._closing)
            generation = self._watch_generation
            initial: list[dict[str, Any]] = []
            expired = False
            if requested in ("", "0"):
                # "Any" version: synthetic ADDED events for the current state, then changes.
                since = self._resource_version
                for (ns, _), obj in sorted(self._objects[kind.resource].items()):
                    if (namespace is None or ns == namespace) and selector.matches(obj):
                        initial.append({"type": "ADDED", "object": copy.deepcopy(obj)})
            elif not requested.isdigit():
                raise ApiError(400, "BadRequest", f'resourceVersion: Invalid value: "{requested}"')
            elif int(requested) < self._compacted_rv:
                expired = True
                since = self._resource_version
            else:
                since = int(requested)
            self._active_watches += 1
            self._cond.notify_all()
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            if expired:
                error = status_body(
                    code=410, reason="Expired", message=f"too old resource version: {requested} ({since})"
                )
                _write_chunk(handler, {"type": "ERROR", "object": error})
            else:
                for event in initial:
                    _write_chunk(handler, event)
                self._stream_changes(
                    handler,
                    kind,
                    since=since,
                    generation=generation,
                    deadline=deadline,
                    namespace=namespace,
                    selector=selector,
                    bookmarks=bookmarks,
                )
            handler.wfile.write(b"0\r\n\r\n")  # the last chunk: the API server ended the watch
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up (Watch.stop() or a reconnect): the stream just ends
        finally:
            handler.close_connection = True
            with self._cond:
                self._active_watches -= 1

    def _stream_changes(
        self,
        handler: BaseHTTPRequestHandler,
        kind: Kind,
        *,
        since: int,
        generation: int,
        deadline: float,
        namespace: str | None,
        selector: Selector,
        bookmarks: bool,
    ) -> None:
        while True:
            with self._cond:
                if self._closing or generation != self._watch_generation:
                    break  # cut off: nothing more reaches this client
                pending = [c for c in self._history if c.resource == kind.resource and c.resource_version > since]
                if not pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(timeout=min(remaining, 0.5))
                    continue
            for change in pending:
                since = change.resource_version
                event = _watch_event(change, namespace=namespace, selector=selector)
                if event is not None:
                    _write_chunk(handler, event)
        with self._cond:
            timed_out = not self._closing and generation == self._watch_generation
            current = str(self._resource_version)
        if bookmarks and timed_out:
            # Sent before a watch times out, so the client resumes from here.
            bookmark = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": {"resourceVersion": current}}
            _write_chunk(handler, {"type": "BOOKMARK", "object": bookmark})


def _watch_event(change: Change, *, namespace: str | None, selector: Selector) -> dict[str, Any] | None:
    """The event a watcher with this selector sees for one change (or None).

    As in the API server, an object that starts matching the selector arrives as ADDED and
    one that stops matching as DELETED.
    """

    def visible(obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if namespace is not None and obj["metadata"].get("namespace") != namespace:
            return False
        return selector.matches(obj)

    was, now = visible(change.before), visible(change.after)
    if now and was:
        return {"type": "MODIFIED", "object": copy.deepcopy(change.after)}
    if now:
        return {"type": "ADDED", "object": copy.deepcopy(change.after)}
    if was and change.before is not None:
        last = copy.deepcopy(change.after if change.after is not None else change.before)
        return {"type": "DELETED", "object": last}
    return None


def _write_chunk(handler: BaseHTTPRequestHandler, event: dict[str, Any]) -> None:
    line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
    handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
    handler.wfile.flush()
