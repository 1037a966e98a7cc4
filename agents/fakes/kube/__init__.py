"""A Kubernetes API server on loopback for ``agents.kube`` and the other users of the official
client (``agents.gpu_requests``, ``agents.owners``, the service's node identity, webhook
certificate and rebalance code in tests).

One module per part of the API it serves: ``server`` (``FakeKubernetes``: lifecycle, pods,
namespaces, nodes, owners, evictions, events), ``store`` (objects, revisions, history),
``watch`` (watch streams), ``dra`` (resource.k8s.io), ``certificates`` (Secrets, webhook
configurations), ``tokens`` (ServiceAccount tokens, TokenReview), ``routing`` (paths and the
HTTP handler) and ``wire`` (what they share: kinds, Status bodies, selectors, patches).
"""

from agents.fakes.kube.dra import RESOURCE_GROUP_VERSIONS
from agents.fakes.kube.server import FakeKubernetes
from agents.fakes.kube.wire import KubeRequest

__all__ = ["RESOURCE_GROUP_VERSIONS", "FakeKubernetes", "KubeRequest"]
