"""Identity: who may speak. Node tokens and the Kubernetes service-account identity of a node,
API tokens for the read API, bearer parsing, login and authentication throttling, the admission
webhook's caller and TLS certificate, the Kubernetes API client they share, and a user's own
preferences. Tokens are stored hashed; every change is audited.

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.identity.admission_auth import (
    HOW_TO_CONFIGURE,
    authenticate_admission_caller,
    load_admission_credentials,
)
from billing.services.identity.api_tokens import (
    MAX_EXPIRY_DAYS,
    MAX_NAME_LENGTH,
    authenticate_api_token,
    expiry_after_days,
    issue_api_token,
    revoke_api_token,
)
from billing.services.identity.auth_throttle import client_address_of
from billing.services.identity.bearer import configured_token, presents_bearer
from billing.services.identity.kube_api import create_token_review, new_api_client
from billing.services.identity.logins import record_login_lockout
from billing.services.identity.node_identity import KubeApiUnavailable
from billing.services.identity.preferences import set_user_language, user_language
from billing.services.identity.tokens import (
    API_TOKEN_PREFIX,
    TOKEN_PREFIX,
    authenticate_node,
    issue_node_token,
    revoke_node_token,
)
from billing.services.identity.webhook_tls import (
    CertificateError,
    DirectoryStore,
    KubernetesStore,
    apply_webhook_certificates,
    kube_api_client,
    service_dns_names,
)

__all__ = [
    "API_TOKEN_PREFIX",
    "HOW_TO_CONFIGURE",
    "MAX_EXPIRY_DAYS",
    "MAX_NAME_LENGTH",
    "TOKEN_PREFIX",
    "CertificateError",
    "DirectoryStore",
    "KubeApiUnavailable",
    "KubernetesStore",
    "apply_webhook_certificates",
    "authenticate_admission_caller",
    "authenticate_api_token",
    "authenticate_node",
    "client_address_of",
    "configured_token",
    "create_token_review",
    "expiry_after_days",
    "issue_api_token",
    "issue_node_token",
    "kube_api_client",
    "load_admission_credentials",
    "new_api_client",
    "presents_bearer",
    "record_login_lockout",
    "revoke_api_token",
    "revoke_node_token",
    "service_dns_names",
    "set_user_language",
    "user_language",
]
