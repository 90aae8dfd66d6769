"""The Kubernetes backend of the lease port: a ``coordination.k8s.io/v1`` Lease per pass.

A claim reads the Lease named after the pass. None yet: create it (a 409 means a peer created it
first). Held by someone else and not expired (``renewTime + leaseDurationSeconds > now`` on the
injected clock): refuse. Expired, released, or already ours: replace it carrying the
``resourceVersion`` that was read, so the API server's optimistic concurrency decides a race (a
409 means another holder won). ``leaseTransitions`` grows on every change of holder and is the
returned lease's fence. Release re-reads the Lease and, if it is still this claim's, replaces it
with no holder and an expired renew time, so the next run claims it at once.

Fail closed: a transport error, a timeout, a 5xx, any status the protocol does not expect, or a
body that does not parse is "cannot tell", and a claim that cannot tell is refused (``None``),
logged with the reason. Release never raises: a lease it cannot release expires on its own.

The API is spoken over plain HTTP(S) with httpx, with a deadline on every request. In a pod the
defaults are the in-cluster ones: ``https://kubernetes.default.svc``, the service account's token
and CA, and its namespace unless config names one. ``leases.kubernetes_api`` overrides the URL
(``kubectl proxy`` at ``http://127.0.0.1:8001``, or a test's scripted server). The token is sent
only over HTTPS.
"""

from __future__ import annotations

import logging
import re
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from libs.common.clock import Clock
from libs.common.config import LeaseConfig
from libs.common.leases import Lease

__all__ = ["IN_CLUSTER_API", "SERVICEACCOUNT_DIR", "KubernetesLeaseClaimer", "format_microtime", "parse_microtime"]

_log = logging.getLogger(__name__)

IN_CLUSTER_API = "https://kubernetes.default.svc"
SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_GROUP_VERSION = "coordination.k8s.io/v1"


def format_microtime(when: datetime) -> str:
    """RFC 3339 with microseconds in UTC, as the API server writes a ``MicroTime``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_FRACTION = re.compile(r"\.(\d+)")


def parse_microtime(text: str) -> datetime:
    """A ``MicroTime`` (or a ``Time`` without a fraction); at most microseconds are kept."""
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), text.strip(), count=1)
    when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"timestamp without a zone: {text!r}")
    return when


class _CannotTell(Exception):
    """The claim's outcome is unknown; the reason is the message."""


@dataclass(frozen=True)
class _Held:
    holder: str
    renew_time: datetime | None
    duration_seconds: int | None
    transitions: int

    def valid_at(self, now: datetime) -> bool:
        if not self.holder or self.renew_time is None or not self.duration_seconds:
            return False
        return self.renew_time + timedelta(seconds=self.duration_seconds) > now


def _held(obj: Any) -> _Held:
    if not isinstance(obj, dict) or obj.get("kind", "Lease") != "Lease":
        raise _CannotTell("the body is not a Lease")
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise _CannotTell("the Lease's spec is not an object")
    renew = spec.get("renewTime") or spec.get("acquireTime")
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions") or 0
    holder = spec.get("holderIdentity") or ""
    try:
        return _Held(
            holder=str(holder),
            renew_time=parse_microtime(renew) if renew else None,
            duration_seconds=int(duration) if duration is not None else None,
            transitions=int(transitions),
        )
    except (TypeError, ValueError) as exc:
        raise _CannotTell(f"unreadable Lease spec ({exc})") from exc


def _resource_version(obj: dict[str, Any]) -> str:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if not version or not isinstance(version, str):
        raise _CannotTell("the Lease has no resourceVersion")
    return version


class KubernetesLeaseClaimer:
    """``LeaseClaimer`` over the Kubernetes Lease API (see the module docstring)."""

    def __init__(
        self,
        api_url: str,
        namespace: str,
        clock: Clock,
        *,
        token_path: Path | None = None,
        ca_path: Path | None = None,
        timeout_seconds: float = 5.0,
    ):
        self._api = api_url.rstrip("/")
        self._namespace = namespace
        self._clock = clock
        self._token_path = token_path
        self._ca_path = ca_path
        self._timeout = httpx.Timeout(timeout_seconds)

    @classmethod
    def from_settings(
        cls, config: LeaseConfig, clock: Clock, *, serviceaccount_dir: Path = SERVICEACCOUNT_DIR
    ) -> KubernetesLeaseClaimer:
        """In-cluster defaults, overridden by ``leases.kubernetes_api`` / ``kubernetes_namespace``.

        The namespace comes from config when it was set there (file or environment), else from the
        pod's service account, else the config default.
        """
        namespace = config.kubernetes_namespace
        if "kubernetes_namespace" not in config.model_fields_set:
            try:
                namespace = (serviceaccount_dir / "namespace").read_text().strip() or namespace
            except OSError:
                pass
        token = serviceaccount_dir / "token"
        ca = serviceaccount_dir / "ca.crt"
        return cls(
            config.kubernetes_api or IN_CLUSTER_API,
            namespace,
            clock,
            token_path=token if token.exists() else None,
            ca_path=ca if ca.exists() else None,
        )

    @property
    def namespace(self) -> str:
        return self._namespace

    # ------------------------------------------------------------------ the port

    async def claim(self, name: str, holder: str, ttl_seconds: int) -> Lease | None:
        try:
            async with self._client() as client:
                return await self._claim(client, name, holder, ttl_seconds)
        except _CannotTell as exc:
            _log.warning("lease %s/%s: cannot tell (%s); not running", self._namespace, name, exc)
        except httpx.HTTPError as exc:
            _log.warning(
                "lease %s/%s: API unreachable (%s: %s); not running", self._namespace, name, type(exc).__name__, exc
            )
        except Exception as exc:  # unknown is not "yes": fail closed
            _log.warning("lease %s/%s: claim failed (%r); not running", self._namespace, name, exc)
        return None

    async def release(self, lease: Lease) -> None:
        try:
            async with self._client() as client:
                await self._release(client, lease)
        except Exception as exc:
            _log.warning("lease %s/%s: release failed (%r); it expires on its own", self._namespace, lease.name, exc)

    # ------------------------------------------------------------------ protocol

    async def _claim(self, client: httpx.AsyncClient, name: str, holder: str, ttl_seconds: int) -> Lease | None:
        now = self._clock.now()
        stamp = format_microtime(now)
        expire = now + timedelta(seconds=ttl_seconds)
        got = await client.get(self._url(name))
        if got.status_code == 404:
            body = {
                "apiVersion": _GROUP_VERSION,
                "kind": "Lease",
                "metadata": {"name": name, "namespace": self._namespace},
                "spec": {
                    "holderIdentity": holder,
                    "leaseDurationSeconds": ttl_seconds,
                    "acquireTime": stamp,
                    "renewTime": stamp,
                    "leaseTransitions": 0,
                },
            }
            created = await client.post(self._url(), json=body)
            if created.status_code == 409:
                _log.info("lease %s/%s: created by another holder first", self._namespace, name)
                return None
            self._expect(created, (200, 201), "create")
            _held(self._json(created))  # the answer must be a Lease, or we cannot tell
            return Lease(name, holder, expire, 0)
        self._expect(got, (200,), "read")
        current = self._json(got)
        held = _held(current)
        version = _resource_version(current)
        if held.holder != holder and held.valid_at(now):
            _log.info("lease %s/%s: held by %s", self._namespace, name, held.holder)
            return None
        takeover = held.holder != holder
        transitions = held.transitions + 1 if takeover else held.transitions
        spec = dict(current.get("spec") or {})
        spec.update(
            holderIdentity=holder,
            leaseDurationSeconds=ttl_seconds,
            renewTime=stamp,
            leaseTransitions=transitions,
        )
        if takeover or not spec.get("acquireTime"):
            spec["acquireTime"] = stamp
        replaced = await client.put(self._url(name), json={**current, "spec": spec})
        if replaced.status_code == 409:
            _log.info(
                "lease %s/%s: another holder replaced it first (resourceVersion %s)", self._namespace, name, version
            )
            return None
        self._expect(replaced, (200,), "replace")
        _held(self._json(replaced))
        if takeover and held.holder:
            _log.info("lease %s/%s: taken over from %s (expired)", self._namespace, name, held.holder)
        return Lease(name, holder, expire, transitions)

    async def _release(self, client: httpx.AsyncClient, lease: Lease) -> None:
        got = await client.get(self._url(lease.name))
        self._expect(got, (200,), "read")
        current = self._json(got)
        held = _held(current)
        if held.holder != lease.holder or held.transitions != lease.fence:
            _log.warning("lease %s/%s: now held by %r; not releasing", self._namespace, lease.name, held.holder)
            return
        now = self._clock.now()
        spec = dict(current.get("spec") or {})
        spec.pop("holderIdentity", None)
        # Expired as of now even for a reader that ignores the cleared holder.
        spec.update(leaseDurationSeconds=1, renewTime=format_microtime(now - timedelta(seconds=1)))
        _resource_version(current)
        replaced = await client.put(self._url(lease.name), json={**current, "spec": spec})
        if replaced.status_code == 409:
            _log.warning("lease %s/%s: changed while releasing; left to expire", self._namespace, lease.name)
            return
        self._expect(replaced, (200,), "release")

    # ------------------------------------------------------------------ transport

    def _url(self, name: str | None = None) -> str:
        base = f"{self._api}/apis/{_GROUP_VERSION}/namespaces/{self._namespace}/leases"
        return f"{base}/{name}" if name else base

    def _client(self) -> httpx.AsyncClient:
        headers = {"Accept": "application/json"}
        secure = self._api.startswith("https://")
        if secure and self._token_path is not None:
            # Re-read each time: the kubelet rotates projected service-account tokens.
            headers["Authorization"] = f"Bearer {self._token_path.read_text().strip()}"
        verify: ssl.SSLContext | bool = True
        if secure and self._ca_path is not None:
            verify = ssl.create_default_context(cafile=str(self._ca_path))
        return httpx.AsyncClient(headers=headers, timeout=self._timeout, verify=verify, trust_env=False)

    @staticmethod
    def _expect(response: httpx.Response, ok: tuple[int, ...], what: str) -> None:
        if response.status_code not in ok:
            raise _CannotTell(f"{what}: HTTP {response.status_code} {response.text[:200]!r}")

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError as exc:
            raise _CannotTell(f"unparsable body ({exc})") from exc
        if not isinstance(body, dict):
            raise _CannotTell("the body is not an object")
        return body
