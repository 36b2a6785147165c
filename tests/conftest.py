"""Test-session configuration.

The GPU machine has no SGLang (and no network to install it): on a ``-m gpu``
run there, the plugin test modules -- which drive the real SGLang package and
hold no GPU tests -- are not collected. Every CPU run (``make test``, CI)
collects them; there a missing SGLang is an import error, not a skip.
"""

from __future__ import annotations

import importlib.util


def pytest_ignore_collect(collection_path, config):
    if collection_path.name.startswith("test_plugin_") and config.getoption("markexpr") == "gpu":
        return importlib.util.find_spec("sglang") is None
    return None
