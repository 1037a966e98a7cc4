"""ServiceAccount tokens (``FakeKubernetes.issue_service_account_token``) and TokenReview."""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agents.fakes.kube.store import Store
from agents.fakes.kube.wire import ApiError

_AUTHENTICATION_API = "authentication.k8s.io/v1"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class _ServiceAccountTokens:
    """The fake API server's token signer and its ServiceAccounts ((namespace, name) -> uid)."""

    key: bytes
    accounts: dict[tuple[str, str], str] = field(default_factory=dict)
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    def sign(self, claims: dict[str, Any]) -> str:
        header = _b64url(json.dumps({"alg": "HS256", "kid": "fake-kube-apiserver"}, separators=(",", ":")).encode())
        payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
        signature = hmac.new(self.key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        return f"{header}.{payload}.{_b64url(signature)}"

    def verify(self, token: str) -> dict[str, Any] | None:
        """The claims of a token this server signed; None for anything else."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        expected = hmac.new(self.key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        try:
            if not hmac.compare_digest(expected, _b64url_decode(parts[2])):
                return None
            claims: dict[str, Any] = json.loads(_b64url_decode(parts[1]))
        except ValueError:  # bad base64 (binascii.Error) or JSON
            return None
        return claims


def _deleted_before(obj: dict[str, Any], moment: datetime) -> bool:
    stamp = obj["metadata"].get("deletionTimestamp")
    return stamp is not None and datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) < moment


class TokenReviews(Store):
    """Bound ServiceAccount tokens as the kubelet's projected `serviceAccountToken` volume gets
    them (TokenRequest bound to a pod), and `POST /apis/authentication.k8s.io/v1/tokenreviews`
    answering as the API server's ServiceAccount authenticator does (pkg/serviceaccount): a
    token is valid while it has not expired, its audience meets the review's, its ServiceAccount
    exists and the pod it is bound to exists with the same uid (a pod deleted more than 60 s ago
    invalidates it). The fake signs with HMAC-SHA256 under a key of its own (the real server
    signs RS256 with its service-account key); the token's holder cannot tell the difference.
    """

    #: the audience of a token or a review that names none (the API server's own)
    API_SERVER_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
    #: True: every TokenReview is refused with 403, as RBAC refuses a reviewer without `create`
    forbid_token_reviews = False

    @functools.cached_property
    def _sa_tokens(self) -> _ServiceAccountTokens:
        return _ServiceAccountTokens(key=secrets.token_bytes(32))

    def use_token_clock(self, now: Callable[[], datetime]) -> None:
        """Check token expiry (and pod deletion) against ``now`` instead of the wall clock."""
        with self._cond:
            self._sa_tokens.now = now

    def service_account_uid(self, namespace: str, name: str) -> str:
        """The ServiceAccount's uid (the API server creates ``default`` in each namespace; the
        fake creates any ServiceAccount a pod names on first use)."""
        with self._cond:
            return self._sa_tokens.accounts.setdefault((namespace, name), str(uuid.uuid4()))

    def delete_service_account(self, namespace: str, name: str) -> None:
        """Every token of this ServiceAccount stops authenticating."""
        with self._cond:
            self._sa_tokens.accounts.pop((namespace, name), None)

    def issue_service_account_token(
        self,
        *,
        namespace: str,
        pod: str | None = None,
        service_account: str | None = None,
        audiences: list[str] | None = None,
        expiration_s: int = 3600,
        issued_at: datetime | None = None,
    ) -> str:
        """A token as TokenRequest issues it: a JWT with ``aud``, ``exp``, ``iat``, ``nbf``,
        ``iss``, ``jti``, ``sub`` and the ``kubernetes.io`` claims.

        With ``pod``, bound to that pod as the kubelet's projected volume gets it (claims:
        namespace, pod, serviceaccount and, since 1.30, the pod's node when the node exists);
        without, bound to nothing, as ``kubectl create token <service_account>`` gets it."""
        if expiration_s < 600:
            raise ValueError(f"expirationSeconds must be at least 600 (10 minutes), got {expiration_s}")
        bound = self.get_pod(namespace, pod) if pod is not None else None  # KeyError: TokenRequest's 404
        spec = (bound or {}).get("spec") or {}
        account = service_account or spec.get("serviceAccountName") or "default"
        if bound is not None and account != (spec.get("serviceAccountName") or "default"):
            raise ValueError(f"pod {namespace}/{pod} runs as {spec.get('serviceAccountName')!r}, not {account!r}")
        with self._cond:
            tokens = self._sa_tokens
            moment = issued_at if issued_at is not None else tokens.now()
            node_name = spec.get("nodeName") or ""
            node = self._objects["nodes"].get(("", node_name)) if node_name else None
        private: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": account, "uid": self.service_account_uid(namespace, account)},
        }
        if bound is not None:
            private["pod"] = {"name": pod, "uid": bound["metadata"]["uid"]}
        if node is not None:
            private["node"] = {"name": node_name, "uid": node["metadata"]["uid"]}
        claims: dict[str, Any] = {
            "aud": list(audiences) if audiences else [self.API_SERVER_AUDIENCE],
            "exp": int(moment.timestamp()) + expiration_s,
            "iat": int(moment.timestamp()),
            "nbf": int(moment.timestamp()),
            "iss": self.API_SERVER_AUDIENCE,
            "jti": str(uuid.uuid4()),
            "sub": f"system:serviceaccount:{namespace}:{account}",
            "kubernetes.io": private,
        }
        return tokens.sign(claims)

    def _review_token(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("kind", "TokenReview") != "TokenReview" or body.get("apiVersion", _AUTHENTICATION_API) != (
            _AUTHENTICATION_API
        ):
            raise ApiError(400, "BadRequest", f"the body of a tokenreviews request must be an {_AUTHENTICATION_API} TokenReview")
        if self.forbid_token_reviews:
            raise ApiError(
                403,
                "Forbidden",
                'tokenreviews.authentication.k8s.io is forbidden: User "system:anonymous" cannot create resource '
                '"tokenreviews" in API group "authentication.k8s.io" at the cluster scope',
                {"group": "authentication.k8s.io", "kind": "tokenreviews"},
            )
        spec = body.get("spec") or {}
        token = spec.get("token") or ""
        if not token:
            raise ApiError(400, "BadRequest", "token is required for TokenReview in authentication")
        requested = list(spec.get("audiences") or [self.API_SERVER_AUDIENCE])
        status = self._authenticate_token(token, requested)
        return {
            "kind": "TokenReview",
            "apiVersion": _AUTHENTICATION_API,
            "metadata": {"creationTimestamp": None},
            "spec": copy.deepcopy(spec),
            "status": status,
        }

    def _authenticate_token(self, token: str, requested: list[str]) -> dict[str, Any]:
        """A TokenReview's ``status``. As in Go, ``authenticated`` and ``audiences`` are left out
        when false or empty, ``user`` is ``{}`` when nobody was authenticated, and an error is a
        string in ``error``, never an HTTP error."""
        with self._cond:
            tokens = self._sa_tokens
            claims = tokens.verify(token)
            if claims is None:
                # Not one of this server's tokens: no authenticator claims it, and none errs.
                return {"user": {}}
            now = tokens.now()
            if claims["exp"] <= now.timestamp():
                return {"user": {}, "error": "service account token has expired"}
            audiences = [a for a in claims["aud"] if a in requested]
            if not audiences:
                return {
                    "user": {},
                    "error": f"token audiences {json.dumps(claims['aud'])} is invalid for the target audiences "
                    f"{json.dumps(requested)}",
                }
            bound = claims["kubernetes.io"]
            namespace = bound["namespace"]
            account = bound["serviceaccount"]
            if tokens.accounts.get((namespace, account["name"])) != account["uid"]:
                return {"user": {}, "error": "service account token has been invalidated"}
            if "pod" in bound:
                pod = self._objects["pods"].get((namespace, bound["pod"]["name"]))
                if pod is None or _deleted_before(pod, now - timedelta(seconds=60)):
                    return {"user": {}, "error": "service account token has been invalidated"}
                if pod["metadata"]["uid"] != bound["pod"]["uid"]:
                    return {
                        "user": {},
                        "error": f"pod UID ({pod['metadata']['uid']}) does not match claim ({bound['pod']['uid']})",
                    }
        extra = {"authentication.kubernetes.io/credential-id": [f"JTI={claims['jti']}"]}
        if "pod" in bound:
            extra["authentication.kubernetes.io/pod-name"] = [bound["pod"]["name"]]
            extra["authentication.kubernetes.io/pod-uid"] = [bound["pod"]["uid"]]
        if "node" in bound:
            extra["authentication.kubernetes.io/node-name"] = [bound["node"]["name"]]
            extra["authentication.kubernetes.io/node-uid"] = [bound["node"]["uid"]]
        return {
            "authenticated": True,
            "user": {
                "username": claims["sub"],
                "uid": account["uid"],
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
                "extra": extra,
            },
            "audiences": audiences,
        }
