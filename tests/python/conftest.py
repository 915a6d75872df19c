"""Shared fixtures for cadeloop's Python tests."""

from __future__ import annotations

import sys

import pytest


def pytest_report_header(config: pytest.Config) -> str:
    return f"cadeloop tests on {sys.executable} ({sys.version.split()[0]})"
