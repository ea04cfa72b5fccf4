"""Fixtures for the actor tests: the fake LLM server (``tests/support/fake_llm.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

# The repository root, so ``tests.support`` imports however pytest was started.
_ROOT = str(Path(__file__).resolve().parents[3])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.support.fake_llm import fake_llm  # noqa: E402

__all__ = ["fake_llm"]
