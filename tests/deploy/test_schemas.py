"""Every object each kustomize variant renders is valid for the oldest and newest
Kubernetes versions we support, checked against their OpenAPI schemas."""

from __future__ import annotations

import pytest

from tests.deploy.manifests import VARIANTS, render

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is a dev extra: pip install -e .[dev]"
)

# The oldest and newest supported minors; the package ships each minor's x.y.0 schemas.
KUBERNETES_VERSIONS = ("1.26.0", "1.31.0")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_object_matches_the_strict_kubernetes_schema(
    variant: str, version: str
) -> None:
    for obj in render(variant):
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            # strict: unknown fields are errors too, so a misspelt key cannot hide.
            used = kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{variant}: {name} is invalid for {version} at {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{variant}: {name}: {e.message}")
        # The package falls back to an older schema when it lacks the one asked for;
        # that would quietly test a different version than the one named here.
        assert used == version.rsplit(".", 1)[0], f"validated against {used}, not {version}"
