"""deploy/k8s/: the example overlay as `kubectl kustomize` renders it matches our own render
(the offline checks of the manifests and the Dockerfile: tests/unit/test_k8s_manifests.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.support.k8s import Doc, render
from tests.unit.test_k8s_manifests import OVERLAY


@pytest.fixture(scope="module")
def overlay() -> list[Doc]:
    return render(OVERLAY)


def test_the_render_matches_kubectl_kustomize(overlay: list[Doc]) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # never a skip: the cross-check would silently not run
        pytest.fail("kubectl is not installed: the machine image ships it (/usr/bin/kubectl)")
    done = subprocess.run(
        [kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr

    def key(d: Doc) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    theirs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert sorted(overlay, key=key) == sorted(theirs, key=key)
