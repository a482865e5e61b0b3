"""Suite-wide settings: kiln's own bugs must fail loudly in tests, not fall back to
eager silently, so internal errors are not suppressed here."""
import os

os.environ.setdefault("KILN_SUPPRESS_ERRORS", "0")
os.environ.setdefault("KILN_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest-kiln-cache"))
