"""Optional packages a test needs: skipped on a developer machine without them, failed in CI."""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """Import ``module``; under ``CI=true`` its absence fails the test instead of skipping it."""
    if os.environ.get("CI") == "true":
        try:
            return __import__(module)
        except ImportError as exc:
            pytest.fail(f"{module} is required under CI and is not installed ({exc})")
    return pytest.importorskip(module)
