"""Suite-wide settings: kiln's own bugs must fail loudly in tests, not fall back to
eager silently, so internal errors are not suppressed here."""
import os

os.environ.setdefault("KILN_SUPPRESS_ERRORS", "0")
# Which code a graph runs must not depend on timing in tests: the perf fallback is
# tested on its own (tests/kernels/test_perf_fallback.py turns it on); run the suite
# with KILN_PERF_FALLBACK=1 to exercise it everywhere.
os.environ.setdefault("KILN_PERF_FALLBACK", "0")
# A process of the suite must trace what its test compiles (tests count traces, read
# capture's logs, patch kiln's tracing): those caches have their own tests
# (tests/capture/test_capture_cache.py, tests/autograd/test_trace_cache.py)
os.environ.setdefault("KILN_CAPTURE_CACHE", "0")
os.environ.setdefault("KILN_TRACE_CACHE", "0")
os.environ.setdefault("KILN_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest-kiln-cache"))
