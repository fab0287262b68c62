"""Where the API server is: a kubeconfig's current context, or the pod's account."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import pytest
import yaml

from agents.cluster.access import from_kubeconfig, in_cluster
from agents.errors import AgentError


def write(path: Path, cluster: dict[str, object], user: dict[str, object]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "b",
        "clusters": [
            {"name": "other", "cluster": {"server": "https://wrong"}},
            {"name": "c", "cluster": cluster},
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "a", "context": {"cluster": "other", "user": "u"}},
            {"name": "b", "context": {"cluster": "c", "user": "u"}},
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_uses_the_current_context_and_its_token(tmp_path: Path) -> None:
    access = from_kubeconfig(
        write(tmp_path / "k", {"server": "http://127.0.0.1:6443"}, {"token": "abc"})
    )
    assert (access.server, access.token, access.tls) == ("http://127.0.0.1:6443", "abc", None)


def test_kubeconfig_token_file_is_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    access = from_kubeconfig(
        write(
            tmp_path / "k",
            {"server": "https://h:6443", "insecure-skip-tls-verify": True},
            {"tokenFile": "tok"},
        )
    )
    assert access.token_file == tmp_path / "tok"
    assert access.tls is not None and access.tls.verify_mode == ssl.CERT_NONE


def test_kubeconfig_with_a_bad_ca_is_refused(tmp_path: Path) -> None:
    cluster: dict[str, object] = {
        "server": "https://h",
        "certificate-authority-data": base64.b64encode(b"junk").decode(),
    }
    with pytest.raises((AgentError, ssl.SSLError)):
        from_kubeconfig(write(tmp_path / "k", cluster, {}))


@pytest.mark.parametrize(
    "text", ["", "[1, 2]", "current-context: x\n"], ids=["empty", "list", "no-context"]
)
def test_a_kubeconfig_that_is_not_one_names_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "k"
    path.write_text(text)
    with pytest.raises(AgentError, match=str(path)):
        from_kubeconfig(path)


def test_a_missing_kubeconfig_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="absent"):
        from_kubeconfig(tmp_path / "absent")


def test_outside_a_pod_there_is_no_in_cluster_access(tmp_path: Path) -> None:
    assert in_cluster({}, tmp_path) is None
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster(env, tmp_path) is None  # no token mounted


def test_in_a_pod_the_service_account_token_is_read_per_request(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    ca = Path(ssl.get_default_verify_paths().openssl_cafile)
    if not ca.is_file():
        pytest.skip("no system CA bundle to stand in for the cluster's")
    (tmp_path / "ca.crt").write_bytes(ca.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    access = in_cluster(env, tmp_path)
    assert access is not None
    assert access.server == "https://[fd00::1]:443"
    assert access.token_file == tmp_path / "token" and access.token is None
