"""A real LiteLLM proxy accepts graphrun's requests (bench/litellm_check.py).

Runs when LiteLLM is installed (``pip install 'litellm[proxy]'``), else skips: it
is not a test dependency (it is large, and the check takes ~30 s).
"""

from __future__ import annotations

import pytest

from bench import litellm_check


@pytest.mark.timeout(300)
def test_litellm_proxy_accepts_graphruns_requests() -> None:
    if litellm_check.litellm_command() is None:
        pytest.skip("litellm is not installed (pip install 'litellm[proxy]')")
    rows = litellm_check.check()
    assert [(model, ok) for model, ok, _detail in rows] == [
        ("gpt-4o-mini", True),
        ("o3", True),
        ("gpt-5", True),
    ], rows
