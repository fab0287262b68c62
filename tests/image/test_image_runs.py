"""The image as the DaemonSet runs it: built by hack/image, started by podman with the
rendered lab overlay's user, capabilities, read-only root, args and mounts, against
the kubelet stand-in on this host through the bind-mounted device-plugin directory.
It registers, answers Allocate with device nodes that exist on the host, serves
/healthz, writes its node labels, and exits 0 on SIGTERM leaving no socket."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agents.sim.root import SUBTREE
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.deploy.manifests import Obj, agent_container, flag, render
from tests.deploy.test_manifests import DRA_DIRS
from tests.image.podman import REPO, PodRun, build_image, container_state, logs, podman, run_once
from tests.nvml.library import STATE_ENV, build
from tests.nvml.nodes import from_profile

LAB = "daemonset/lab"
DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
NFD_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
SIM_ROOT = "/var/lib/node-agent-sim"
GPU, NIC = "nvidia.com/gpu", "rdma/roce"
BUILD_WITHIN = 480.0  # a clean machine makes the Debian base first
REGISTERED_WITHIN = 60.0  # container start and Python's imports on a loaded machine
STOPPED_WITHIN = 30  # the DaemonSet's terminationGracePeriodSeconds
_names = itertools.count()


@pytest.fixture(scope="module")
def image() -> str:
    return build_image(BUILD_WITHIN)


@pytest.fixture(params=[None, "own"], ids=["simulated", "real-nvml"])
def nvml_lib(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """None for the simulated node; or a host directory holding the project's test
    libnvidia-ml.so.1 (tests/nvml) and its state file (the H100 profile), for the real NVML
    backend: mounted read-only at /opt/nvml with LD_LIBRARY_PATH pointing there, and the
    base DaemonSet runs instead of the lab overlay (see `pod_run`). That runs the image's
    own Python, pynvml and libc over it."""
    if request.param is None:
        return None
    directory = tmp_path / "nvml"
    directory.mkdir()
    shutil.copy2(build() / "libnvidia-ml.so.1", directory / "libnvidia-ml.so.1")
    from_profile("h100").write(directory / "state")
    directory.chmod(0o755)
    return directory


@pytest.fixture
def host_dirs() -> Iterator[dict[str, Path]]:
    """Short fresh directories standing in for the DaemonSet's hostPaths (a unix socket
    path must fit in 108 bytes); the simulator's root is mounted at its own path."""
    made = {path: Path(tempfile.mkdtemp(prefix="img-")) for path in (DEVICE_PLUGINS, NFD_DIR)}
    made[POD_RESOURCES] = Path(tempfile.mkdtemp(prefix="img-pr-"))
    made[SIM_ROOT] = Path(tempfile.mkdtemp(prefix="img-sim-"))
    # The DRA drivers' directories, the plugin registry and the CDI specs: empty here.
    for path in DRA_DIRS:
        made[path] = Path(tempfile.mkdtemp(prefix="img-dra-"))
    made["/sys"] = Path("/sys")
    yield made
    for path, directory in made.items():
        if path != "/sys":
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def standin(host_dirs: dict[str, Path]) -> AsyncIterator[Kubelet]:
    kubelet = Kubelet(
        host_dirs[DEVICE_PLUGINS],
        seed=7,
        pod_resources_socket=host_dirs[POD_RESOURCES] / "kubelet.sock",
    )
    await kubelet.start()
    yield kubelet
    await kubelet.stop()


@pytest.fixture
def pod_run(
    image: str, nvml_lib: Path | None, host_dirs: dict[str, Path], tmp_path: Path
) -> PodRun:
    if nvml_lib is None:
        objs = render(LAB)
        args = objs_args(objs)
        # The simulator's root is a hostPath at the same path: here, the test's directory.
        args[args.index(SIM_ROOT)] = str(host_dirs[SIM_ROOT])
        host_dirs[SIM_ROOT].chmod(0o755)
        _mount_at_own_path(objs, host_dirs[SIM_ROOT])
        return PodRun(objs, image, host_dirs, tmp_path)
    run = PodRun(render("daemonset"), image, host_dirs, tmp_path)
    run.mounts.append(f"{nvml_lib}:/opt/nvml:ro")
    run.env["LD_LIBRARY_PATH"] = "/opt/nvml"
    run.env[STATE_ENV] = "/opt/nvml/state"
    return run


def k_allocatable(kubelet: Kubelet) -> int:
    return int(kubelet.allocatable().get(GPU, 0))


def objs_args(objs: list[Obj]) -> list[str]:
    args: list[str] = agent_container(objs)["args"]
    return args


def _mount_at_own_path(objs: list[Obj], directory: Path) -> None:
    """Mount the stand-in of the sim-root hostPath at its own path, as the overlay mounts
    its hostPath at the hostPath's path."""
    for mount in agent_container(objs)["volumeMounts"]:
        if mount["mountPath"] == SIM_ROOT:
            mount["mountPath"] = str(directory)


@pytest.fixture
def container(pod_run: PodRun) -> Iterator[str]:
    name = f"node-agent-test-{os.getpid()}-{next(_names)}"
    yield name
    written = logs(name)
    podman("rm", "--force", "--time", "0", name, check=False)
    print(f"--- {name} log ---\n{written}")


@pytest.mark.timeout(BUILD_WITHIN + 120)
async def test_the_image_registers_allocates_and_stops_as_the_daemonset_runs_it(
    pod_run: PodRun,
    container: str,
    standin: Kubelet,
    host_dirs: dict[str, Path],
    nvml_lib: Path | None,
) -> None:
    started = time.monotonic()
    podman(*pod_run.args(container))
    await standin.wait_until(
        lambda k: (
            (
                bool(k.allocatable().get(GPU))
                and (nvml_lib is not None or k.allocatable().get(NIC) == 8)
            )
            or container_state(container)[0] != "running"
        ),
        REGISTERED_WITHIN,
    )
    assert container_state(container)[0] == "running", logs(container)
    print(f"podman run -> allocatable: {time.monotonic() - started:.2f} s")

    limits = {GPU: 2} if nvml_lib is not None else {GPU: 2, NIC: 2}
    got = (await standin.admit(Pod("p", [Container("c", limits)]))).containers["c"]
    assert len(got.devices[GPU]) == 2
    if nvml_lib is not None:  # the H100 profile's GPUs, as NVML named them
        assert k_allocatable(standin) == 8
        visible = got.responses[GPU].envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert all(v.startswith("GPU-01000100-") for v in visible), visible
    if nvml_lib is None:
        _assert_device_nodes_on_the_host(got.responses[NIC].devices, host_dirs[SIM_ROOT])

    healthz = podman(
        "exec",
        container,
        "python3",
        "-c",
        "import urllib.request as u;print(u.urlopen('http://127.0.0.1:17400/healthz').status)",
    )
    assert healthz == "200"
    assert "node-agents.io/gpu.count=" in (host_dirs[NFD_DIR] / "node-agents").read_text()
    rss = podman("exec", container, "grep", "VmRSS", "/proc/1/status")
    print(f"agent memory in the container: {rss}")

    stopping = time.monotonic()
    podman("stop", "--time", str(STOPPED_WITHIN), container, timeout=STOPPED_WITHIN + 30)
    print(f"podman stop: {time.monotonic() - stopping:.2f} s")
    assert container_state(container) == ("exited", 0)
    assert sorted(p.name for p in host_dirs[DEVICE_PLUGINS].glob("*.sock")) == ["kubelet.sock"]
    if nvml_lib is None:
        assert os.listdir(host_dirs[SIM_ROOT]) == []  # its subtree gone, the hostPath kept


def _assert_device_nodes_on_the_host(specs: Sequence[Any], sim_root: Path) -> None:
    paths = {s.container_path: s.host_path for s in specs}
    assert "/dev/infiniband/rdma_cm" in paths
    for container_path, host_path in paths.items():
        assert host_path == f"{sim_root}/{SUBTREE}{container_path}"
        # A character device, made in the container (CAP_MKNOD), real on the host.
        assert stat.S_ISCHR(os.lstat(host_path).st_mode), host_path


# Every module of the installed package with its digest, as the image holds it.
_INSTALLED_DIGESTS = """
import hashlib, json, pathlib, agents
root = pathlib.Path(agents.__file__).parent
print(json.dumps({str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in root.rglob("*.py")}))
"""


@pytest.mark.timeout(BUILD_WITHIN + 60)
def test_the_image_holds_this_trees_code(image: str) -> None:
    """An image that kept an older build (a stale cached step) would pass every other
    test here on old code: the installed package must be this tree's, file for file."""
    tree = REPO / "agents"
    want = {
        str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in tree.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    got = json.loads(run_once(image, "python3", "-c", _INSTALLED_DIGESTS))
    assert sorted(set(want) ^ set(got)) == []
    assert sorted(k for k in want if want[k] != got[k]) == []


def test_lab_overlay_names_the_simulated_node_the_image_bundles() -> None:
    assert flag(objs_args(render(LAB)), "--simulate") == "h100-8gpu-8nic"
