"""Ingest of usage batches (wire protocol v1, docs/protocol.md): decode, validate, store.

A batch is written in one transaction by billing.ledger.batches: the batch row (unique per node
and batch_seq), its GPUs, and its samples through COPY into the day-partitioned raw table.
Retries of the same content answer "duplicate"; a concurrent upload of the same batch waits on
the unique index and then answers "duplicate" too.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from datetime import datetime

import orjson
import psycopg2.errors
from django.conf import settings
from django.db import IntegrityError, transaction

from billing.errors import FieldError, Forbidden, InvalidBatch, PayloadTooLarge, UnsupportedMediaType
from billing.ledger.batches import IngestResult, overlap_message, prepare_partitions, store_batch
from billing.models import Node
from billing.services.ingest.batch_validation import summed_per_minute, validate_batch
from billing.services.ingest.tenant_mapping import map_batch_tenants, note_claim_mismatches

__all__ = ["IngestResult", "decode_body", "record_usage_batch"]

def decode_body(*, body: bytes, content_type: str | None, content_encoding: str | None) -> tuple[object, bytes]:
    """Undo Content-Encoding and parse JSON. Returns (payload, decoded bytes)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        raise UnsupportedMediaType(f"Content-Type must be application/json, not {media or 'missing'!r}")
    encoding = (content_encoding or "identity").strip().lower()
    limit = settings.VGPU_INGEST_MAX_JSON_BYTES
    if encoding == "gzip":
        raw = _gunzip(body, limit)
    elif encoding == "identity":
        raw = body
    else:
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported (use gzip or none)")
    try:
        # orjson: about 3x faster than json on batch-sized documents (docs/benchmarks.md).
        # It rejects NaN/Infinity literals, which the protocol forbids anyway, input that is not
        # UTF-8, and nesting deeper than 1,024 levels.
        return orjson.loads(raw), raw
    except orjson.JSONDecodeError as exc:
        return _parse_fallback(raw, exc), raw


def _gunzip(body: bytes, limit: int) -> bytes:
    """One whole gzip member, at most `limit` bytes once decompressed."""
    decoder = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        raw = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidBatch([FieldError("$", f"body is not valid gzip: {exc}")]) from exc
    if len(raw) > limit or decoder.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body is above {limit} bytes")
    if not decoder.eof:
        raise InvalidBatch([FieldError("$", "body is a truncated gzip stream")])
    if decoder.unused_data:
        # A second member (or trailing bytes) would otherwise be ignored without a word.
        raise InvalidBatch([FieldError("$", "body must be exactly one gzip member; bytes follow its end")])
    return raw


def _parse_fallback(raw: bytes, orjson_error: orjson.JSONDecodeError) -> object:
    """Python's json takes over only for integers beyond 64 bits, which orjson refuses but
    validation must answer with a precise 400. It reads UTF-8 alone (RFC 8259: json.loads would
    guess UTF-16 from the bytes) and its own recursion limit is an error, not a crash."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsupportedMediaType(f"body must be JSON in UTF-8: {exc}") from exc
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise InvalidBatch([FieldError("$", "JSON nests too deeply (at most 1,024 levels)")]) from exc
    except json.JSONDecodeError as exc:
        raise UnsupportedMediaType(f"body is not valid JSON: {orjson_error}") from exc


def record_usage_batch(*, node: Node, payload: object, content: bytes, now: datetime) -> IngestResult:
    """Validate and store one batch for `node` (already authenticated)."""
    batch = validate_batch(
        payload,
        now=now,
        max_skew=settings.VGPU_INGEST_MAX_CLOCK_SKEW,
        max_samples=settings.VGPU_INGEST_MAX_SAMPLES,
        horizon=settings.VGPU_LATE_USAGE_HORIZON,
    )
    if batch.node != node.name:
        raise Forbidden(f"this token belongs to node {node.name!r}, the batch names {batch.node!r}")
    # The tenant each sample is billed to is the service's mapping of its namespace, never only
    # the node's claim (billing.services.ingest.tenant_mapping); the digest stays that of the bytes sent,
    # so a retry of the same batch is still a duplicate.
    batch, mismatches = map_batch_tenants(batch)
    batch = summed_per_minute(batch)  # after the mapping, which counts the claims per sample as sent
    digest = hashlib.sha256(content).hexdigest()
    prepare_partitions(batch)  # before the transaction below takes any lock
    try:
        with transaction.atomic():
            result = store_batch(node=node, batch=batch, digest=digest, now=now)
            if result.status == "stored":
                note_claim_mismatches(node, mismatches, now=now)
            return result
    except (IntegrityError, psycopg2.errors.ExclusionViolation) as exc:
        if "batch_gpu_no_overlap" in str(exc):
            raise InvalidBatch([FieldError("$.window", overlap_message(batch))]) from exc
        raise


