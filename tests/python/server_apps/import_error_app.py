"""Raises while being imported."""

raise RuntimeError("broken at import time")
