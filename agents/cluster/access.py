"""Where the API server is: the pod's service account, or a kubeconfig file. Blocking
(files, TLS contexts): callers run it in a thread."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.errors import AgentError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Access:
    """Where the API server is and how to show who we are."""

    server: str  # https://10.0.0.1:443
    tls: ssl.SSLContext | None = None  # None for a plain http:// server
    token: str | None = None
    token_file: Path | None = None  # read at each request: tokens are rotated in place
    source: str = ""  # "in-cluster" or the kubeconfig path, for logs


def in_cluster(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT) -> Access | None:
    """The in-cluster service account, or None when this is not a pod that has one."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token = account / "token"
    if not host or not port or not token.is_file():
        return None
    if ":" in host:
        host = f"[{host}]"
    tls = ssl.create_default_context(cafile=str(account / "ca.crt"))
    return Access(f"https://{host}:{port}", tls, token_file=token, source="in-cluster")


def from_kubeconfig(path: Path) -> Access:
    """The current context of a kubeconfig file. Raises AgentError naming what is wrong."""
    import yaml  # only where a kubeconfig is read

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise AgentError(f"{path}: unreadable kubeconfig: {exc}") from exc
    if not isinstance(doc, dict):
        raise AgentError(f"{path}: not a kubeconfig")
    base = path.parent
    context = _named(doc, "contexts", doc.get("current-context"), path)["context"]
    cluster = _named(doc, "clusters", context.get("cluster"), path)["cluster"]
    user = _named(doc, "users", context.get("user"), path).get("user") or {}
    server = str(cluster.get("server", ""))
    if not server.startswith(("https://", "http://")):
        raise AgentError(f"{path}: cluster server {server!r} is no http(s) URL")
    tls = _tls(cluster, user, base) if server.startswith("https://") else None
    token_file = user.get("tokenFile")
    return Access(
        server,
        tls,
        token=user.get("token"),
        token_file=base / token_file if token_file else None,
        source=str(path),
    )


def _named(doc: dict[str, Any], section: str, name: object, path: Path) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    raise AgentError(f"{path}: {section}: no entry named {name!r}")


def _tls(cluster: dict[str, Any], user: dict[str, Any], base: Path) -> ssl.SSLContext:
    if cluster.get("insecure-skip-tls-verify"):
        tls = ssl.create_default_context()
        tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    elif "certificate-authority-data" in cluster:
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        tls = ssl.create_default_context(cadata=ca)
    elif "certificate-authority" in cluster:
        tls = ssl.create_default_context(cafile=str(base / cluster["certificate-authority"]))
    else:
        tls = ssl.create_default_context()
    cert, key = _pem(user, "client-certificate", base), _pem(user, "client-key", base)
    if cert is not None and key is not None:
        _load_pair(tls, cert, key)
    return tls


def _pem(user: dict[str, Any], field: str, base: Path) -> bytes | None:
    if f"{field}-data" in user:
        return base64.b64decode(user[f"{field}-data"])
    if field in user:
        return (base / str(user[field])).read_bytes()
    return None


def _load_pair(tls: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl reads a client pair only from files: a private file, removed at once."""
    with tempfile.TemporaryDirectory(prefix="node-agent-tls-") as work:
        pair = Path(work) / "pair.pem"
        fd = os.open(pair, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(cert.rstrip(b"\n") + b"\n" + key)
        tls.load_cert_chain(str(pair))
