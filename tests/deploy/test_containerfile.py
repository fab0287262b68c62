"""The image recipe: a pinned, multi-stage build whose final stage holds only the
installed wheels, runs `node-agent` in exec form, and carries OCI labels."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "Containerfile"
IGNOREFILE = REPO / ".dockerignore"
DAEMONSET = REPO / "daemonset" / "base" / "daemonset.yaml"

BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|cmake|build-essential|[\w.+-]+-dev|git|curl|wget)\b"
)
REQUIRED_LABELS = ("title", "description", "source", "version", "licenses")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the rest of the logical line, continuations joined


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def instructions(text: str) -> list[Instruction]:
    """Logical instructions: comments dropped, backslash continuations joined."""
    result: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        result.append(Instruction(keyword.upper(), " ".join(args.split())))
        pending = ""
    assert not pending, "the file ends inside a continued line"
    return result


def global_args(text: str) -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults: what FROM lines may name."""
    found: dict[str, str] = {}
    for ins in instructions(text):
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            found[name] = default
    return found


def stages(text: str) -> list[Stage]:
    """The stages, base images as a plain `build` names them (ARG defaults filled in)."""
    result: list[Stage] = []
    defaults = global_args(text)
    for ins in instructions(text):
        if ins.keyword == "FROM":
            args = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m[1], m[0]), ins.args)
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(words[0], name))
        elif result:
            result[-1].instructions.append(ins)
        else:
            assert ins.keyword == "ARG", f"{ins.keyword} before the first FROM"
    return result


@pytest.fixture(scope="module")
def parsed() -> list[Stage]:
    return stages(CONTAINERFILE.read_text())


def test_build_has_a_builder_stage_and_a_final_stage(parsed: list[Stage]) -> None:
    assert len(parsed) >= 2
    assert all(s.name for s in parsed[:-1]), "earlier stages are named, to copy from"


def test_base_image_is_a_build_argument_whose_default_is_slim_python() -> None:
    # hack/image builds on a Debian root filesystem made locally; every other build
    # gets python:3.11-slim-bookworm, the same for both stages.
    text = CONTAINERFILE.read_text()
    assert global_args(text) == {"BASE": "python:3.11-slim-bookworm"}
    froms = [i.args.split()[0] for i in instructions(text) if i.keyword == "FROM"]
    assert froms == ["${BASE}", "${BASE}"]


def test_every_base_image_is_pinned_by_tag_or_digest(parsed: list[Stage]) -> None:
    earlier: set[str] = set()
    for stage in parsed:
        if stage.image not in earlier:
            tag = stage.image.rsplit("/", 1)[-1].partition(":")[2]
            assert "@sha256:" in stage.image or (tag and tag != "latest"), stage.image
            assert "$" not in stage.image, "a base image named by a build arg is not pinned"
        if stage.name:
            earlier.add(stage.name)


def test_final_stage_is_slim_python_with_no_build_tools(parsed: list[Stage]) -> None:
    final = parsed[-1]
    assert final.image.startswith("python:") and "slim" in final.image
    for ins in final.all("RUN"):
        assert not re.search(r"\b(apt-get|apt|apk|dnf|yum)\b", ins.args), ins.args
        assert not BUILD_TOOLS.search(ins.args), f"build tool in the final stage: {ins.args}"
    for ins in final.all("COPY"):
        # Only wheels may come from the builder, and the recipe mounts them instead.
        assert "--from" not in ins.args, ins.args


def test_final_stage_installs_only_the_builders_wheels(parsed: list[Stage]) -> None:
    installs = [i.args for i in parsed[-1].all("RUN") if "pip install" in i.args]
    assert len(installs) == 1
    assert "--no-index" in installs[0], "the final stage must not fetch from an index"
    assert f"from={parsed[0].name}" in installs[0], "wheels come from the builder stage"


def test_every_pip_install_and_wheel_keeps_no_cache(parsed: list[Stage]) -> None:
    for stage in parsed:
        for ins in stage.all("RUN"):
            for command in re.findall(r"pip3? (?:install|wheel)\b[^&;|]*", ins.args):
                assert "--no-cache-dir" in command, command


def test_no_add_instruction_fetches_a_url(parsed: list[Stage]) -> None:
    for stage in parsed:
        for ins in stage.all("ADD"):
            assert not re.search(r"\b(https?|ftp)://|git@", ins.args), ins.args


def test_entrypoint_and_cmd_use_exec_form(parsed: list[Stage]) -> None:
    final = parsed[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    (cmd,) = final.all("CMD")
    # Exec form: node-agent is PID 1 and receives SIGTERM itself, with no shell between.
    assert json.loads(entrypoint.args) == ["node-agent"]
    assert json.loads(cmd.args) == ["run"]


def test_final_stage_carries_oci_labels(parsed: list[Stage]) -> None:
    labels = " ".join(i.args for i in parsed[-1].all("LABEL"))
    for key in REQUIRED_LABELS:
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_image_user_is_the_uid_the_daemonset_runs_as(parsed: list[Stage]) -> None:
    users = parsed[-1].all("USER")
    assert users, "the final stage must say which user it runs as"
    daemonset = yaml.safe_load(DAEMONSET.read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert users[-1].args == str(container["securityContext"]["runAsUser"])


def image_env(stage: Stage) -> dict[str, str]:
    """ENV of a stage, in its KEY=VALUE form (the only one this file uses)."""
    pairs = [word.split("=", 1) for i in stage.all("ENV") for word in i.args.split()]
    assert all(len(pair) == 2 for pair in pairs), "ENV KEY=VALUE only"
    return {key: value for key, value in pairs}


def test_image_leaves_the_gpu_variables_to_the_daemonset_so_roce_only_has_none(
    parsed: list[Stage],
) -> None:
    # The runtime's GPU hook acts on NVIDIA_VISIBLE_DEVICES from the image as much as from
    # the pod: set in the image, the roce-only overlay could not take it away, and on a
    # node without a GPU driver the container would fail to start.
    from tests.deploy.manifests import agent_container, render

    image = image_env(parsed[-1])
    assert "PYTHONUNBUFFERED" in image
    for variant in ("daemonset", "daemonset/overlays/roce-only"):
        pod = {e["name"] for e in agent_container(render(variant)).get("env", [])}
        seen = {k for k in (*image, *pod) if k.startswith("NVIDIA_")}
        expected = (
            set()
            if variant.endswith("roce-only")
            else {
                "NVIDIA_VISIBLE_DEVICES",
                "NVIDIA_DRIVER_CAPABILITIES",
            }
        )
        assert seen == expected, variant
    assert not any(k.startswith("NVIDIA_") for k in image)


def test_build_context_leaves_out_venv_git_and_tests() -> None:
    ignored = {
        line.strip().rstrip("/")
        for line in IGNOREFILE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git", "tests"} <= ignored
    # The wheel is built from these; ignoring one would break the image build.
    assert not ignored & {"agents", "hack", "pyproject.toml", "README.md", "proto"}


HADOLINT = shutil.which("hadolint")

if HADOLINT is not None:  # not packaged by Debian: a check for machines that have it

    def test_hadolint_finds_nothing() -> None:
        assert HADOLINT is not None
        out = subprocess.run(
            [HADOLINT, str(CONTAINERFILE)], capture_output=True, text=True, check=False, timeout=60
        )
        assert out.returncode == 0, out.stdout + out.stderr
