"""Shared fixtures of the Python package's tests (run by tests/scripts/python-test.sh in the venv the wheel was
installed into). Ray tests start their own clusters; nothing here needs network."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

# Ray's token auth would otherwise turn on (and warn) where ~/.ray/auth_token exists.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def fixtures() -> pathlib.Path:
    return FIXTURES
