"""Approved GPU models (docs/billing.md, Approved GPU models): the names an admin has vouched for.

A node reports its GPUs' model names itself, so a name is a claim, not a fact. Only an approved
name may be priced (billing.services.pricing.rate_cards refuses a card for any other) and offered in the
rate-card form; a GPU whose model is not approved is flagged on the nodes page, in /healthz and in
/metrics, and its usage stays unpriced. That usage never holds the month's close: the close bills
everything priced and lists the rest as its own item (billing.services.invoicing.close), and once the
model is approved and priced it is billed as a late-usage adjustment on the next invoice.

Ingest does not consult this list (a batch is never refused for its model: usage is never lost);
the flag is read from it whenever it is shown, so approving a name clears it at once.

Names are validated as NVML reports them (`check_nvml_name`): "NVIDIA A100-SXM4-80GB",
"NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB". Approving and retiring are audited
("gpu_model.approved", "gpu_model.retired").
"""

from __future__ import annotations

import re
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.models import Gpu, GpuModel, RateCard
from billing.services.audit import record_audit_event

__all__ = [
    "MODEL_NAME_MAX_LEN",
    "approve_gpu_model",
    "approved_gpu_models",
    "check_nvml_name",
    "count_unapproved_gpus",
    "is_approved",
    "retire_gpu_model",
    "unapproved_fleet_models",
]

# NVML's device name buffer (NVML_DEVICE_NAME_V2_BUFFER_SIZE) holds 96 bytes with the NUL.
MODEL_NAME_MAX_LEN = 95
# Printable ASCII in NVML's shape: a letter or digit first, then letters, digits, single spaces
# and . _ ( ) / + - ; never two spaces, never a trailing space, no control or lookalike characters.
_NVML_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._()/+-]| (?! ))*(?<! )$")
_NOTE_MAX_LEN = 500
_REASON_MAX_LEN = 500


def check_nvml_name(name: str) -> str:
    """`name` trimmed, if it looks like a name NVML reports; else `InvalidInput`."""
    name = name.strip()
    if not name:
        raise InvalidInput(_("GPU model is required (exactly as NVML names it)"))
    if len(name) > MODEL_NAME_MAX_LEN:
        raise InvalidInput(_("GPU model may have at most %(n)s characters") % {"n": MODEL_NAME_MAX_LEN})
    if not _NVML_NAME.match(name):
        raise InvalidInput(
            _("GPU model %(model)r is not a GPU model name: use letters, digits, single spaces and . _ ( ) / + - "
              "exactly as NVML names it, such as NVIDIA H100 80GB HBM3") % {"model": name})
    return name


def _fold(name: str) -> str:
    return " ".join(name.split()).casefold()


def approved_gpu_models() -> list[str]:
    """Names approved and not retired, in name order: the only ones a rate card may price."""
    return list(GpuModel.objects.filter(retired_at__isnull=True).order_by("name").values_list("name", flat=True))


def is_approved(name: str) -> bool:
    # A NUL never reaches the query: Postgres refuses it in a string literal (a 500); no approved name has one.
    return "\x00" not in name and GpuModel.objects.filter(name=name, retired_at__isnull=True).exists()


def unapproved_fleet_models() -> dict[str, int]:
    """Model name -> GPUs in the fleet reporting it, for names not approved (or retired)."""
    approved = set(approved_gpu_models())
    counts: dict[str, int] = {}
    for model in Gpu.objects.values_list("model", flat=True):
        if model not in approved:
            counts[model] = counts.get(model, 0) + 1
    return dict(sorted(counts.items()))


def count_unapproved_gpus() -> int:
    """GPUs in the fleet whose reported model is not approved: one query, no names (for /healthz
    and /metrics, which an unauthenticated or scraping caller reads)."""
    approved = GpuModel.objects.filter(retired_at__isnull=True).values("name")
    return Gpu.objects.exclude(model__in=approved).count()


def _audit(*, now: datetime, actor_label: str, actor_id: int | None, action: str, row: GpuModel,
           before: dict[str, object] | None) -> None:
    record_audit_event(
        at=now, actor_id=actor_id, actor_label=actor_label, action=action, object_type="gpu_model",
        object_id=row.name, before=before,
        after={"name": row.name, "note": row.note, "retired_at": row.retired_at.isoformat() if row.retired_at else None,
               "retire_reason": row.retire_reason})


def approve_gpu_model(*, name: str, note: str = "", now: datetime, actor_label: str,
                      actor_id: int | None = None) -> GpuModel:
    """Approve `name` (or approve a retired name again). Refused: a name not in NVML's shape, and a
    name that differs from an approved one only in case or spacing (a card for a misspelt model
    prices nothing, and two spellings of one card would split its usage)."""
    name = check_nvml_name(name)
    note = " ".join(note.split())
    if len(note) > _NOTE_MAX_LEN:
        raise InvalidInput(_("the note may have at most %(n)s characters") % {"n": _NOTE_MAX_LEN})
    with transaction.atomic():
        row = GpuModel.objects.select_for_update().filter(name=name).first()
        if row is not None and row.retired_at is None:
            raise InvalidInput(_("%(model)s is already approved") % {"model": name})
        twin = next((m for m in approved_gpu_models() if _fold(m) == _fold(name) and m != name), None)
        if twin is not None:
            raise InvalidInput(
                _("GPU model %(model)r differs from the approved model %(known)r only in case or spacing")
                % {"model": name, "known": twin})
        before: dict[str, object] | None = None
        if row is None:
            row = GpuModel(name=name)
        else:
            before = {"name": row.name, "retired_at": row.retired_at.isoformat() if row.retired_at else None,
                      "retire_reason": row.retire_reason}
        row.approved_at, row.approved_by, row.note = now, actor_label, note
        row.retired_at, row.retired_by, row.retire_reason = None, "", ""
        try:
            with transaction.atomic():
                row.save()
        except IntegrityError as exc:  # another admin approved the same name in between
            raise InvalidInput(_("%(model)s is already approved") % {"model": name}) from exc
        _audit(now=now, actor_label=actor_label, actor_id=actor_id, action="gpu_model.approved", row=row,
               before=before)
    return row


def retire_gpu_model(*, name: str, reason: str, now: datetime, actor_label: str,
                     actor_id: int | None = None) -> GpuModel:
    """Retire an approved name: no new rate card may price it and GPUs reporting it are flagged.
    Refused while a rate card prices the model now or later (end or retire the card first, so
    retiring a name never silently takes a price away)."""
    reason = " ".join(reason.split())
    if not reason:
        raise InvalidInput(_("say why the GPU model is retired: the reason is kept in the audit log"))
    if len(reason) > _REASON_MAX_LEN:
        raise InvalidInput(_("the reason may have at most %(n)s characters") % {"n": _REASON_MAX_LEN})
    with transaction.atomic():
        # A NUL (no approved name has one) never reaches the query: Postgres refuses it with a 500.
        row = None if "\x00" in name else (
            GpuModel.objects.select_for_update().filter(name=name, retired_at__isnull=True).first())
        if row is None:
            raise InvalidInput(_("%(model)s is not an approved GPU model") % {"model": name})
        pricing = (RateCard.objects.filter(gpu_model=name, retired_at__isnull=True)
                   .exclude(effective_to__lte=now).first())
        if pricing is not None:
            raise InvalidInput(
                _("rate card #%(id)s still prices %(model)s; end or retire it first")
                % {"id": pricing.pk, "model": name})
        before: dict[str, object] = {"name": row.name, "retired_at": None}
        row.retired_at, row.retired_by, row.retire_reason = now, actor_label, reason
        row.save(update_fields=["retired_at", "retired_by", "retire_reason"])
        _audit(now=now, actor_label=actor_label, actor_id=actor_id, action="gpu_model.retired", row=row,
               before=before)
    return row
