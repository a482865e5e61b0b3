import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(autouse=True, scope="session")
def _kiln_cache(tmp_path_factory):
    """A private kernel cache for the test session (the cache test uses its own)."""
    import kiln.config
    old = kiln.config.cache_dir
    kiln.config.cache_dir = os.environ.get("KILN_TEST_CACHE_DIR") or str(
        tmp_path_factory.mktemp("kiln-cache"))
    yield
    kiln.config.cache_dir = old
