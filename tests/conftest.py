"""Test-session configuration.

The GPU machine has no SGLang (and no network to install it): on a ``-m gpu``
run there, the plugin test modules -- which drive the real SGLang package and
hold no GPU tests -- are not collected. Every CPU run (``make test``, CI)
collects them; there a missing SGLang is an import error, not a skip.
"""

from __future__ import annotations

import importlib.util

import pytest


def pytest_ignore_collect(collection_path, config):
    if collection_path.name.startswith("test_plugin_") and config.getoption("markexpr") == "gpu":
        return importlib.util.find_spec("sglang") is None
    return None



@pytest.fixture(autouse=True)
def _fresh_scorer_launchers(monkeypatch):
    """Each test resolves the paged scorer's, the store op's and the planner's launchers itself: they are kept
    per process, and a test that stands in for a GPU, a build or a failure must not see another test's."""
    from sglang_fp4_indexer.ops import paged_logits, quantize, schedule

    monkeypatch.setattr(paged_logits, "_SCORERS", {})
    quantize.store_launcher.cache_clear()
    schedule.planner_for.cache_clear()
