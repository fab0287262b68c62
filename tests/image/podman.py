"""The image built by hack/image, run with podman as a rendered DaemonSet runs it: its
args, env, user, capabilities, read-only root and mounts, each hostPath replaced by a
directory of the test's own."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.manifests import Obj, agent_container, pod_spec

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/node-agent:dev"
IMAGE_ENV = "NODE_AGENT_IMAGE"  # an image built beforehand; hack/image runs otherwise
POD_IP = "127.0.0.1"
NODE_NAME = "image-test-node"
# As root, podman asks the runtime for limits above this process's own (nofile 1048576),
# which a sandbox without CAP_SYS_RESOURCE cannot grant; ask for what we have.
_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
_NPROC = 4096
# cgroupfs and a file for events: no systemd needed. runc: crun refuses hosts whose
# cgroup v2 hierarchy holds controllers beside v1 ("hybrid"), and runc runs anywhere.
PODMAN_GLOBAL = ("--cgroup-manager", "cgroupfs", "--events-backend", "file", "--runtime", "runc")


def need(tool: str) -> str:
    """The tool's path; its absence fails the test in CI and skips it elsewhere."""
    found = shutil.which(tool)
    if found is None:
        why = f"{tool} is not installed (apt-get install {tool})"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


def podman(*args: str, timeout: float = 60, check: bool = True) -> str:
    out = subprocess.run(
        [need("podman"), *PODMAN_GLOBAL, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check:
        assert out.returncode == 0, f"podman {' '.join(args)}:\n{out.stdout}{out.stderr}"
    return out.stdout.strip()


@dataclass
class PodRun:
    """`podman run` arguments for the agent container of a rendered DaemonSet."""

    objs: list[Obj]
    image: str
    host_dirs: Mapping[str, Path]  # hostPath path -> the test's directory standing in
    scratch: Path  # configMap volumes are written here
    env: dict[str, str] = field(default_factory=dict)  # added to the manifest's
    mounts: list[str] = field(default_factory=list)  # added --volume arguments

    def args(self, name: str) -> list[str]:
        container = agent_container(self.objs)
        return [
            "run",
            *("--detach", "--name", name, "--network", "none", "--log-driver", "k8s-file"),
            *("--ulimit", f"nofile={_NOFILE}:{_NOFILE}", "--ulimit", f"nproc={_NPROC}:{_NPROC}"),
            *_security(container["securityContext"]),
            *self._env(container),
            *self._volumes(container),
            *(a for m in self.mounts for a in ("--volume", m)),
            self.image,
            *(a.replace("$(POD_IP)", POD_IP) for a in container["args"]),
        ]

    def _env(self, container: Obj) -> list[str]:
        fields = {"spec.nodeName": NODE_NAME, "status.podIP": POD_IP}
        env = {
            e["name"]: e["value"]
            if "value" in e
            else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container.get("env", [])
        }
        return [a for k, v in {**env, **self.env}.items() for a in ("--env", f"{k}={v}")]

    def _volumes(self, container: Obj) -> list[str]:
        volumes = {v["name"]: v for v in pod_spec(self.objs)["volumes"]}
        out: list[str] = []
        for mount in container["volumeMounts"]:
            volume, target = volumes[mount["name"]], mount["mountPath"]
            mode = "ro" if mount.get("readOnly") else "rw"
            if "hostPath" in volume:
                out += ["--volume", f"{self.host_dirs[volume['hostPath']['path']]}:{target}:{mode}"]
            elif "configMap" in volume:
                source = self._config_map(volume["configMap"]["name"])
                out += ["--volume", f"{source}:{target}:ro"]
            elif "emptyDir" in volume:
                size = volume["emptyDir"].get("sizeLimit", "64Mi").replace("Mi", "m")
                out += ["--tmpfs", f"{target}:rw,size={size}"]
            else:
                raise AssertionError(f"no stand-in for volume {volume}")
        return out

    def _config_map(self, name: str) -> Path:
        (config_map,) = [
            o for o in self.objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name
        ]
        directory = self.scratch / name
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in config_map["data"].items():
            (directory / key).write_text(text)
        return directory


def _security(ctx: Obj) -> list[str]:
    """podman's words for a container securityContext."""
    out = ["--user", f"{ctx['runAsUser']}:{ctx['runAsGroup']}"]
    out += [f"--cap-drop={c}" for c in ctx["capabilities"].get("drop", [])]
    out += [f"--cap-add={c}" for c in ctx["capabilities"].get("add", [])]
    if ctx.get("readOnlyRootFilesystem"):
        out.append("--read-only")
    if ctx.get("allowPrivilegeEscalation") is False:
        out += ["--security-opt", "no-new-privileges"]
    assert not ctx.get("privileged"), "a privileged agent is not what the DaemonSet runs"
    return out


def build_image(timeout: float) -> str:
    """The image to run: $NODE_AGENT_IMAGE if set, else hack/image builds it from this
    tree."""
    given = os.environ.get(IMAGE_ENV)
    if given:
        podman("image", "exists", given)
        return given
    for tool in ("mmdebstrap", "buildah", "podman", "runc"):
        need(tool)
    out = subprocess.run(
        [str(REPO / "hack/image"), "--tag", IMAGE],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, f"hack/image failed:\n{out.stdout}{out.stderr}"
    return IMAGE


def run_once(image: str, *command: str, timeout: float = 60) -> str:
    """The output of `command` in a throwaway container of the image (no network)."""
    limits = ("--ulimit", f"nofile={_NOFILE}:{_NOFILE}", "--ulimit", f"nproc={_NPROC}:{_NPROC}")
    entrypoint, *args = command
    return podman(
        "run",
        "--rm",
        "--network",
        "none",
        *limits,
        "--entrypoint",
        entrypoint,
        image,
        *args,
        timeout=timeout,
    )


def logs(name: str) -> str:
    """What the container wrote (the agent logs to stderr)."""
    out = subprocess.run(
        [need("podman"), *PODMAN_GLOBAL, "logs", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
    return out.stdout


def container_state(name: str) -> tuple[str, int]:
    """(status, exit code) of a container."""
    status, code = podman(
        "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name
    ).split()
    return status, int(code)
