"""Certificates for the admission webhook's HTTPS port, with no certificate operator needed.

The API server only calls a webhook over TLS and only trusts the CA bundle written into the
ValidatingWebhookConfiguration (`clientConfig.caBundle`). So we keep a CA of our own and a
serving certificate it signs for the webhook Service's DNS names:

- the CA (10 years) lives in its own Secret, which only the certificate Job reads; the web pods
  never see its key;
- the serving certificate (90 days by default) and its key live in the `kubernetes.io/tls`
  Secret that the web pods mount; it is renewed when less than `renew_before` of it is left, or
  when the names it must carry or the CA change;
- the CA bundle is the CA's certificate, plus the previous CA's while that one is still valid, so
  pods still serving a certificate of the old CA stay trusted while a new CA rolls out.

Planning (`plan_certificates`) is pure: it takes what is stored and an explicit `now` and says
what to store. `DirectoryStore` and `KubernetesStore` read and write it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from billing.services.identity.kube_api import new_api_client

__all__ = [
    "CA_VALIDITY",
    "CertificateError",
    "DirectoryStore",
    "Issued",
    "KubernetesStore",
    "StoredCertificates",
    "WebhookCertificates",
    "apply_webhook_certificates",
    "kube_api_client",
    "plan_certificates",
    "service_dns_names",
]

CA_VALIDITY = timedelta(days=3650)
CA_COMMON_NAME = "vGPU Ledger admission webhook CA"
_BACKDATE = timedelta(minutes=5)  # tolerate clocks a little behind ours (the API server's, a node's)


class CertificateError(Exception):
    """What is stored cannot be used, or the cluster refused a change; the message says which and what to do."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True)
class StoredCertificates:
    """What a store holds today; None where it holds nothing."""

    ca: Issued | None
    serving: Issued | None


@dataclass(frozen=True)
class WebhookCertificates:
    """What the store must hold after this run, and what changed."""

    ca: Issued
    serving: Issued
    ca_bundle: bytes
    ca_issued: bool
    serving_issued: bool
    reasons: tuple[str, ...] = field(default=())  # why each new certificate was issued


def service_dns_names(*, service: str, namespace: str, extra: Sequence[str] = ()) -> list[str]:
    """The names the API server uses for a webhook Service (`<svc>.<ns>.svc`) and its FQDN, then `extra`."""
    names = [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]
    return names + [name for name in extra if name not in names]


def plan_certificates(*, stored: StoredCertificates, dns_names: Sequence[str], now: datetime,
                      serving_validity: timedelta, renew_before: timedelta) -> WebhookCertificates:
    """Keep what is still good, issue what is not. A CA near its end (or past it) is replaced;
    one that is not a usable CA at all raises CertificateError: it is the root of trust, so it
    is never replaced silently."""
    if not dns_names:
        raise CertificateError("at least one DNS name is needed for the serving certificate")
    if renew_before >= serving_validity:
        raise CertificateError(f"renew-before ({renew_before.days} days) must be shorter than the validity "
                               f"({serving_validity.days} days), or every run would renew")
    reasons: list[str] = []
    previous_ca: Issued | None = None
    ca = stored.ca
    if ca is not None:
        _check_ca(ca)
        ends = ca.certificate.not_valid_after_utc
        if ends < now + serving_validity:
            # An expired CA vouches for nothing any more, so replacing it takes nothing from anyone.
            previous_ca, ca = ca, None
            reasons.append("the CA expired" if ends <= now else "the CA expires before a new serving certificate would")
    ca_issued = ca is None
    if ca is None:
        ca = _issue_ca(now=now)
        if previous_ca is None:
            reasons.append("no CA yet")
    serving = stored.serving
    why = _why_reissue(serving, ca=ca, dns_names=dns_names, now=now, renew_before=renew_before)
    if serving is None or why:
        serving = _issue_serving(ca=ca, dns_names=dns_names, now=now, validity=serving_validity)
        reasons.append(why)
    bundle = ca.cert_pem
    if previous_ca is not None and previous_ca.certificate.not_valid_after_utc > now:
        bundle += previous_ca.cert_pem
    return WebhookCertificates(ca=ca, serving=serving, ca_bundle=bundle, ca_issued=ca_issued,
                               serving_issued=bool(why), reasons=tuple(reasons))


# -- checks ---------------------------------------------------------------------------------


def _check_ca(ca: Issued) -> None:
    try:
        cert = ca.certificate
        key = serialization.load_pem_private_key(ca.key_pem, password=None)
    except ValueError as exc:
        raise CertificateError(f"the stored CA cannot be read ({exc}); delete it to have a new one made "
                               "(the webhook's caBundle changes with it)") from exc
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CertificateError("the stored CA certificate is not a CA (no basicConstraints CA:TRUE)")
    if _public_bytes(key.public_key()) != _public_bytes(cert.public_key()):
        raise CertificateError("the stored CA key does not belong to the stored CA certificate")


def _why_reissue(serving: Issued | None, *, ca: Issued, dns_names: Sequence[str], now: datetime,
                 renew_before: timedelta) -> str:
    """Why the serving certificate must be issued again; "" when it may stay."""
    if serving is None:
        return "no serving certificate"
    try:
        cert = serving.certificate
        key = serialization.load_pem_private_key(serving.key_pem, password=None)
    except ValueError:
        return "the stored serving certificate or key cannot be read"
    if _public_bytes(key.public_key()) != _public_bytes(cert.public_key()):
        return "the stored serving key does not belong to its certificate"
    if not _signed_by(cert, ca.certificate):
        return "the serving certificate is not signed by the current CA"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = set(sans.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = set()
    if names != set(dns_names):
        return f"the serving certificate names {sorted(names)}, wanted {sorted(dns_names)}"
    left = cert.not_valid_after_utc - now
    if left < renew_before:
        return f"the serving certificate expires in {max(left.days, 0)} days (renewing {renew_before.days} days before)"
    return ""


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _public_bytes(key: Any) -> bytes:
    return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


# -- issuing --------------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: accepted by the API server (Go), OpenSSL and every TLS client we meet; small and fast.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _issue_ca(*, now: datetime) -> Issued:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE).not_valid_after(now + CA_VALIDITY)
        # pathlen 0: this CA signs serving certificates only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def _issue_serving(*, ca: Issued, dns_names: Sequence[str], now: datetime, validity: timedelta) -> Issued:
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertificateError(f"the CA key is a {type(ca_key).__name__}; only EC and RSA CA keys can sign here")
    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE).not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        # Go checks names in the SAN only (the CN is ignored), so every name goes there.
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


# -- stores ---------------------------------------------------------------------------------


class CertificateStore(Protocol):
    def read(self) -> StoredCertificates: ...

    def write(self, planned: WebhookCertificates) -> list[str]:
        """Store what changed; returns one line per change made."""
        ...


def apply_webhook_certificates(
    *, store: CertificateStore, dns_names: Sequence[str], now: datetime, serving_validity: timedelta,
    renew_before: timedelta,
) -> tuple[WebhookCertificates, list[str]]:
    """Read, plan, write: the whole run, safe to repeat (a second run changes nothing)."""
    planned = plan_certificates(stored=store.read(), dns_names=dns_names, now=now,
                                serving_validity=serving_validity, renew_before=renew_before)
    return planned, store.write(planned)


class DirectoryStore:
    """PEM files in one directory: ca.crt, ca.key, tls.crt, tls.key (the names of a
    `kubernetes.io/tls` Secret's keys, so `kubectl create secret tls --cert tls.crt --key tls.key`
    takes them as they are). Keys are written 0600, each file replaced atomically."""

    FILES: ClassVar[dict[str, str]] = {"ca_cert": "ca.crt", "ca_key": "ca.key", "cert": "tls.crt", "key": "tls.key"}

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def read(self) -> StoredCertificates:
        files = {name: self._read(filename) for name, filename in self.FILES.items()}
        ca = _pair(files["ca_cert"], files["ca_key"], what=f"the CA in {self.directory}")
        serving = _pair(files["cert"], files["key"], what=None)
        return StoredCertificates(ca=ca, serving=serving)

    def write(self, planned: WebhookCertificates) -> list[str]:
        self.directory.mkdir(parents=True, exist_ok=True)
        wanted = {"ca.crt": planned.ca_bundle, "ca.key": planned.ca.key_pem,
                  "tls.crt": planned.serving.cert_pem, "tls.key": planned.serving.key_pem}
        changed = []
        for filename, content in wanted.items():
            if self._read(filename) != content:
                _write_atomically(self.directory / filename, content, secret=filename.endswith(".key"))
                changed.append(f"wrote {self.directory / filename}")
        return changed

    def _read(self, filename: str) -> bytes | None:
        path = self.directory / filename
        return path.read_bytes() if path.exists() else None


def _pair(cert: bytes | None, key: bytes | None, *, what: str | None) -> Issued | None:
    """A certificate with its key; half a pair is an error for the CA (`what` names it), and
    simply nothing for the serving certificate (it is ours to issue again)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        if what is None:
            return None
        raise CertificateError(f"{what} has a {'certificate' if key is None else 'key'} but no "
                               f"{'key' if key is None else 'certificate'}; restore it, or delete both to have a new "
                               "CA made")
    return Issued(cert_pem=_first_certificate(cert) if what is not None else cert, key_pem=key)


def _first_certificate(pem: bytes) -> bytes:
    """A CA file may be a bundle (the current CA first, then the previous one): the CA is its first
    certificate. Unreadable data is passed on as it is, for _check_ca to report."""
    try:
        return x509.load_pem_x509_certificates(pem)[0].public_bytes(serialization.Encoding.PEM)
    except ValueError:
        return pem


def _write_atomically(path: Path, content: bytes, *, secret: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    # A leftover of an interrupted run could carry other permissions (or be a link): start afresh.
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.replace(tmp, path)


def kube_api_client(url: str = "") -> Any:
    """The official client for `url` (e.g. a `kubectl proxy`) or VGPU_KUBE_API, else the
    in-cluster configuration; outside a cluster with neither, a CertificateError saying so."""
    from kubernetes import config

    try:
        return new_api_client(url)
    except config.ConfigException as exc:
        raise CertificateError(f"not running in a cluster ({exc}); pass --kube-api URL or set VGPU_KUBE_API") from exc


CERT_MANAGER_ANNOTATION = "cert-manager.io/inject-ca-from"


class KubernetesStore:
    """The two Secrets and the webhook configuration, through the official client.

    Writes go CA Secret → caBundle → serving Secret, so at every step the API server trusts the
    certificate the pods serve: a new CA is trusted before anything signed by it is served, and
    the old CA stays in the bundle (see `plan_certificates`). Every update names the
    resourceVersion that was read, so a concurrent change is a conflict, not a lost write.
    """

    def __init__(self, api_client: Any, *, namespace: str, tls_secret: str, ca_secret: str,
                 webhook_configuration: str) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._admission = client.AdmissionregistrationV1Api(api_client)
        self.namespace, self.tls_secret, self.ca_secret = namespace, tls_secret, ca_secret
        self.webhook_configuration = webhook_configuration
        self._versions: dict[str, str | None] = {}
        self._webhook_names: list[str] = []
        self._bundles: list[bytes | None] = []

    def read(self) -> StoredCertificates:
        config = self._call(f"read ValidatingWebhookConfiguration {self.webhook_configuration}",
                            self._admission.read_validating_webhook_configuration, self.webhook_configuration,
                            missing_ok=True)
        if config is None:
            raise CertificateError(f"ValidatingWebhookConfiguration {self.webhook_configuration} not found: apply "
                                   "deploy/k8s/admission-webhook.yaml first (or name yours with "
                                   "--webhook-configuration)")
        annotations = config.metadata.annotations or {}
        if CERT_MANAGER_ANNOTATION in annotations:
            raise CertificateError(f"{self.webhook_configuration} has {CERT_MANAGER_ANNOTATION}: cert-manager "
                                   "manages its caBundle; use cert-manager or this command, not both")
        self._webhook_names = [hook.name for hook in config.webhooks or []]
        if not self._webhook_names:
            raise CertificateError(f"{self.webhook_configuration} has no webhooks to give a caBundle to")
        self._versions["webhooks"] = config.metadata.resource_version
        self._bundles = [_decode_bundle(hook.client_config.ca_bundle) for hook in config.webhooks]
        ca_data = self._read_secret(self.ca_secret)
        tls_data = self._read_secret(self.tls_secret)
        ca = None if ca_data is None else _pair(ca_data.get("ca.crt"), ca_data.get("ca.key"),
                                                what=f"Secret {self.namespace}/{self.ca_secret}")
        serving = None if tls_data is None else _pair(tls_data.get("tls.crt"), tls_data.get("tls.key"), what=None)
        return StoredCertificates(ca=ca, serving=serving)

    def write(self, planned: WebhookCertificates) -> list[str]:
        changed = []
        if planned.ca_issued:
            self._put_secret(self.ca_secret, {"ca.crt": planned.ca.cert_pem, "ca.key": planned.ca.key_pem},
                             object_type="Opaque")
            changed.append(f"stored a new CA in Secret {self.namespace}/{self.ca_secret}")
        if any(bundle != planned.ca_bundle for bundle in self._bundles):
            # Merged by webhook name (a strategic merge patch); the resourceVersion read is a precondition.
            patch = {"metadata": {"resourceVersion": self._versions["webhooks"]},
                     "webhooks": [{"name": name, "clientConfig": {"caBundle": _b64(planned.ca_bundle)}}
                                  for name in self._webhook_names]}
            self._call(f"patch the caBundle of {self.webhook_configuration}",
                       self._admission.patch_validating_webhook_configuration, self.webhook_configuration, patch)
            changed.append(f"patched caBundle into ValidatingWebhookConfiguration {self.webhook_configuration}")
        if planned.serving_issued:
            self._put_secret(self.tls_secret, {"tls.crt": planned.serving.cert_pem, "tls.key": planned.serving.key_pem,
                                               "ca.crt": planned.ca_bundle}, object_type="kubernetes.io/tls")
            changed.append(f"stored a new serving certificate in Secret {self.namespace}/{self.tls_secret}")
        return changed

    def _read_secret(self, name: str) -> dict[str, bytes] | None:
        secret = self._call(f"read Secret {self.namespace}/{name}", self._core.read_namespaced_secret, name,
                            self.namespace, missing_ok=True)
        self._versions[name] = None if secret is None else secret.metadata.resource_version
        if secret is None:
            return None
        return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}

    def _put_secret(self, name: str, data: dict[str, bytes], *, object_type: str) -> None:
        body = {
            "apiVersion": "v1", "kind": "Secret", "type": object_type,
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/managed-by": "vgpu-ledger-webhook-certificate"}},
            "data": {key: _b64(value) for key, value in data.items()},
        }
        version = self._versions.get(name)
        if version is None:
            self._call(f"create Secret {self.namespace}/{name}", self._core.create_namespaced_secret,
                       self.namespace, body)
        else:
            body["metadata"]["resourceVersion"] = version  # type: ignore[index]  # metadata is the dict above
            self._call(f"update Secret {self.namespace}/{name}", self._core.replace_namespaced_secret, name,
                       self.namespace, body)

    def _call(self, what: str, fn: Any, *args: Any, missing_ok: bool = False) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=30)
        except ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            hint = {403: " (does the Job's ServiceAccount have the Role in deploy/k8s/webhook-certificate-job.yaml?)",
                    409: " (it changed while this ran; run again)"}.get(exc.status or 0, "")
            raise CertificateError(f"cannot {what}: {exc.status} {exc.reason}: {_api_message(exc)}{hint}") from exc
        except Exception as exc:  # urllib3's connection errors and the like, reported with what we tried
            raise CertificateError(f"cannot {what}: {type(exc).__name__}: {exc}") from exc


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return (exc.body or "")[:300]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _decode_bundle(value: Any) -> bytes | None:
    """caBundle as the client hands it back: base64 text (the wire form) or bytes."""
    if not value:
        return None
    raw = value.encode() if isinstance(value, str) else bytes(value)
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        return raw  # already decoded PEM
