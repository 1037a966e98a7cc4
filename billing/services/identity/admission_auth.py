"""Who may call the admission webhook: the API server, by bearer token or by client certificate.

A review is not read-only: a CREATE reserves a tenant's guaranteed GPU quota (an AdmittedPod
row) and a DELETE frees it, so an anonymous caller could deny a tenant's real pods or overrun
its quota. Every review therefore needs a credential, and with none configured every review is
refused: the operator learns why from `manage.py check` (billing/checks.py) and from the 401.

Two credentials, either one enough:
- a bearer token, from VGPU_ADMISSION_TOKEN or the file VGPU_ADMISSION_TOKEN_FILE (a mounted
  Secret; read on every review, so a rotated Secret takes effect without a restart);
- a client certificate verified by the TLS-terminating proxy, which passes the certificate's
  subject DN (RFC 4514) in the header VGPU_ADMISSION_CLIENT_CERT_HEADER; its CN must be one of
  VGPU_ADMISSION_CLIENT_CERT_CNS. Only safe when that proxy overwrites the header and is the
  only way in, hence off unless both settings are given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings

from billing.errors import NotAuthenticated
from billing.services.identity.auth_throttle import check_not_throttled, note_failure
from billing.services.identity.bearer import configured_token, presents_bearer
from billing.services.identity.tokens import token_sha256

__all__ = ["AdmissionCredentials", "authenticate_admission_caller", "common_name_of", "load_admission_credentials"]

HOW_TO_CONFIGURE = ("set VGPU_ADMISSION_TOKEN_FILE (or VGPU_ADMISSION_TOKEN), or VGPU_ADMISSION_CLIENT_CERT_HEADER "
                    "with VGPU_ADMISSION_CLIENT_CERT_CNS; see docs/operations.md")


@dataclass(frozen=True)
class AdmissionCredentials:
    token: str  # "" when no usable token is configured
    problem: str  # why the configured credentials cannot be used; "" when they can
    cert_header: str  # the HTTP header the proxy sets, e.g. X-Client-Cert-DN; "" when off
    cert_common_names: frozenset[str]

    @property
    def configured(self) -> bool:
        return not self.problem and bool(self.token or self.cert_header)


def load_admission_credentials() -> AdmissionCredentials:
    header = settings.VGPU_ADMISSION_CLIENT_CERT_HEADER.strip()
    names = frozenset(settings.VGPU_ADMISSION_CLIENT_CERT_CNS)
    token, problem = configured_token("VGPU_ADMISSION_TOKEN")
    if header and not names:
        problem = problem or "VGPU_ADMISSION_CLIENT_CERT_HEADER is set but VGPU_ADMISSION_CLIENT_CERT_CNS is empty"
    if names and not header:
        problem = problem or "VGPU_ADMISSION_CLIENT_CERT_CNS is set but VGPU_ADMISSION_CLIENT_CERT_HEADER is empty"
    return AdmissionCredentials(token=token, problem=problem, cert_header=header, cert_common_names=names)


def authenticate_admission_caller(*, credentials: AdmissionCredentials, authorization: str,
                                  client_cert_dn: str | None, client: str | None = None) -> str:
    """Who called ("bearer-token" or "client-cert:<CN>"), or NotAuthenticated with the reason.
    With the caller's address `client`, a wrong credential counts as a failure of that address
    (billing.services.identity.auth_throttle), and a blocked address is refused (Overloaded, 429) unless
    it presents the configured token or an accepted client certificate."""
    if credentials.problem:
        raise NotAuthenticated(f"admission webhook credentials are misconfigured ({credentials.problem}); "
                               "every review is refused")
    if not credentials.configured:
        raise NotAuthenticated(f"admission webhook has no credential configured, so every review is refused: "
                               f"{HOW_TO_CONFIGURE}")
    if presents_bearer(authorization, credentials.token):
        return "bearer-token"
    if credentials.cert_header and client_cert_dn:
        name = common_name_of(client_cert_dn)
        if name is not None and name in credentials.cert_common_names:
            return f"client-cert:{name}"
    # A right credential passed above whatever its address did; a wrong one costs no look-up
    # here, but guessing the token is throttled like any other token's.
    check_not_throttled(client=client, token_sha256=token_sha256(authorization.partition(" ")[2].strip()))
    note_failure(client=client, kind="admission")
    raise NotAuthenticated("admission webhook credential missing or wrong: present the bearer token from the "
                           "webhook kubeconfig, or a client certificate the proxy accepts")



_RDN_SPLIT = re.compile(r"(?<!\\),")


def common_name_of(subject_dn: str) -> str | None:
    """The CN of an RFC 4514 subject DN ("CN=kube-apiserver,O=k8s"); None when it has none or
    several (an ambiguous subject is no identity)."""
    names = []
    for rdn in _RDN_SPLIT.split(subject_dn):
        key, sep, value = rdn.strip().partition("=")
        if sep and key.strip().upper() == "CN":
            names.append(re.sub(r"\\(.)", r"\1", value.strip()))
    return names[0] if len(names) == 1 and names[0] else None
