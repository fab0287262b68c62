"""The client over TLS as a kubeconfig describes it: the cluster's CA, a client
certificate and key given inline, against the stand-in serving https that demands a
client certificate, with one handshake for many calls. Certificates are made for the
test by the openssl command."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from agents.cluster.access import from_kubeconfig
from agents.cluster.client import ApiClient, UnreachableError
from agents.cluster.reporter import STRATEGIC, Reporter
from agents.core.health import DeviceHealth, GpuLost
from agents.tasks import until
from tests.conditions import async_wait_until
from tests.standin.apiserver import ApiServer

NODE = "tls-node"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(work: Path, name: str, cn: str, ext: str) -> None:
    (work / f"{name}.ext").write_text(ext)
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}"),
        cwd=work,
    )
    _openssl(
        *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext"),
        cwd=work,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("openssl is not installed: it makes the test's certificates")
        pytest.skip("openssl is not installed: it makes the test's certificates")
    work = tmp_path_factory.mktemp("pki")
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test-ca"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        cwd=work,
    )
    _issue(
        work, "server", "127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    )
    _issue(work, "client", "node-agent", "extendedKeyUsage=clientAuth\n")
    return work


@pytest.fixture
async def server(pki: Path) -> AsyncIterator[ApiServer]:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
    tls.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    tls.verify_mode = ssl.CERT_REQUIRED  # as an API server with client-certificate auth
    server = ApiServer((NODE,), tls=tls)
    await server.start()
    yield server
    await server.stop()


def _kubeconfig(pki: Path, url: str, with_client_cert: bool = True) -> Path:
    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    user = {"client-certificate-data": data("client.crt"), "client-key-data": data("client.key")}
    doc = {
        "apiVersion": "v1",
        "current-context": "tls",
        "clusters": [
            {
                "name": "tls",
                "cluster": {"server": url, "certificate-authority-data": data("ca.crt")},
            }
        ],
        "users": [{"name": "agent", "user": user if with_client_cert else {"token": "x"}}],
        "contexts": [{"name": "tls", "context": {"cluster": "tls", "user": "agent"}}],
    }
    path = pki / f"kubeconfig-{with_client_cert}"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_reports_go_over_tls_with_a_client_certificate(server: ApiServer, pki: Path) -> None:
    access = from_kubeconfig(_kubeconfig(pki, server.url))
    reporter = Reporter(NODE, ApiClient(access), settle_s=0)
    stop = asyncio.Event()
    bad = DeviceHealth("nvidia.com/gpu", "GPU-1", "GPU 1", GpuLost())
    task = asyncio.ensure_future(until(stop, lambda: reporter.run(lambda: [bad])))
    reporter.changed(bad)
    try:
        await async_wait_until(lambda: len(server.store.events) == 1, 10.0)
        condition = server.store.condition(NODE, "DevicesHealthy")
        assert condition is not None and condition["status"] == "False"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10.0)


async def test_without_the_client_certificate_the_handshake_fails(
    server: ApiServer, pki: Path
) -> None:
    access = from_kubeconfig(_kubeconfig(pki, server.url, with_client_cert=False))
    async with ApiClient(access, timeout_s=5.0) as client:
        with pytest.raises(UnreachableError):
            await client.request("PATCH", f"/api/v1/nodes/{NODE}/status", {})


async def test_many_calls_over_tls_make_one_handshake(server: ApiServer, pki: Path) -> None:
    async with ApiClient(from_kubeconfig(_kubeconfig(pki, server.url))) as client:
        for _ in range(20):
            await client.request("PATCH", f"/api/v1/nodes/{NODE}/status", {}, STRATEGIC)
        await client.list("/api/v1/nodes")
    assert len(server.calls) == 21 and {c.code for c in server.calls} == {200}
    assert server.connections == 1  # each one accepted over TLS is a handshake
