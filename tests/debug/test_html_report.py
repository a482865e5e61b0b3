"""The trace report rendered by a real browser: headless Chromium (Debian's ``chromium``
package; skipped where it is not installed) loads index.html from disk and shows the
breaks, the recompile and the kernels."""
import html
import os
import shutil
import subprocess

import pytest

import kiln
from kiln.debug import trace_dir
from tests.debug import trace_program as prog

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [pytest.mark.chromium, pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]


def _chromium(*args, timeout=120):
    # --no-sandbox: the sandbox refuses to run as root (CI containers)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-dev-shm-usage", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def render_report(out_dir) -> str:
    """Trace the test program into ``out_dir``; the path of its index.html."""
    try:
        with kiln.config.patch(trace_dir=str(out_dir)):
            prog.run(kiln.compile(prog.two_breaks, backend="kiln"))
    finally:
        trace_dir.sync()
    return os.path.join(str(out_dir), "index.html")


def test_chromium_renders_breaks_recompile_and_kernels(tmp_path):
    page = render_report(tmp_path / "trace")
    r = _chromium("--dump-dom", f"file://{page}")
    assert r.returncode == 0, r.stderr[-2000:]
    dom = html.unescape(r.stdout)
    assert "<h1>kiln trace</h1>" in dom
    first = prog.line_of('print("kiln trace test: first break")')
    second = prog.line_of('print("kiln trace test: second break")')
    assert f"{prog.__file__}:{first}" in dom and f"{prog.__file__}:{second}" in dom
    assert "L['x'].shape[0] was 4, now 8" in dom
    assert "C++ kernels" in dom and 'extern "C" void kiln_seg0' in dom
    shot = tmp_path / "report.png"
    r = _chromium("--window-size=1280,1600", f"--screenshot={shot}", f"file://{page}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert shot.stat().st_size > 10_000          # a page was drawn, not a blank
