"""Which node a GPU belongs to. Ingest gives a GPU to the first node that declares it and refuses
it to every other node (billing.services.ingest.batches); a card that really moved is handed over here,
by an admin, audited. Usage the old owner already metered stays billed to it."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from billing.errors import InvalidInput
from billing.models import Gpu, Node
from billing.services.audit import record_audit_event

__all__ = ["reassign_gpu"]


def reassign_gpu(*, uuid: str, to_node: str, reason: str, now: datetime, actor_label: str,
                 actor_id: int | None = None) -> Gpu:
    if not reason.strip():
        raise InvalidInput("reason: say why the GPU moved (it goes into the audit log)")
    with transaction.atomic():
        gpu = Gpu.objects.select_for_update().select_related("node").filter(uuid=uuid).first()
        if gpu is None:
            raise InvalidInput(f"uuid: no GPU {uuid!r} has been metered")
        node = Node.objects.filter(name=to_node).first()
        if node is None:
            raise InvalidInput(f"to_node: no node {to_node!r} is enrolled")
        if node.pk == gpu.node_id:
            raise InvalidInput(f"to_node: GPU {uuid} already belongs to node {to_node!r}")
        before = {"node": gpu.node.name}
        gpu.node = node
        gpu.save(update_fields=["node"])
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="gpu.reassigned",
                           object_type="gpu", object_id=uuid, before=before,
                           after={"node": to_node, "reason": reason.strip()})
    return gpu
