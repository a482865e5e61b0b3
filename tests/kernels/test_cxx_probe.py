"""The C++ compiler check (``kiln/kernels/toolchain/cxx_probe.py``): a compiler that fails a probe
gets the first workaround that makes it pass, remembered on disk."""
import os
import stat

import pytest

from kiln import config
from kiln.kernels.toolchain import cxx_build as cache
from kiln.kernels.toolchain import cxx_probe


def test_probes_are_correct_programs():
    """Unoptimised, every probe passes (a probe that always failed would turn every
    compiler's optimisations off)."""
    assert cxx_probe.failing_probes(cache.CXX, ["-O0", "-std=c++17"]) == []


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "cache"))
    return tmp_path


def _fake_cxx(d):
    """A compiler that 'miscompiles' unless given -fno-tree-loop-if-convert."""
    p = d / "fake-cxx"
    p.write_text('#!/bin/sh\ncase " $* " in *" -fno-tree-loop-if-convert "*) exec g++ "$@";; '
                 'esac\nexec g++ -DBROKEN "$@"\n')
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_a_miscompiling_compiler_gets_a_workaround(fresh_cache, monkeypatch, caplog):
    monkeypatch.setattr(cxx_probe, "PROBES", {
        "fake": "int main() {\n#ifdef BROKEN\n return 1;\n#endif\n return 0; }\n"})
    cxx = _fake_cxx(fresh_cache)
    flags = ["-O2"]
    assert cxx_probe.workaround_flags(cxx, flags, "fake 1.0") == ["-fno-tree-loop-if-convert"]
    assert "miscompiles fake" in caplog.text
    # remembered: a second call runs no compiler
    monkeypatch.setattr(cxx_probe, "failing_probes", lambda *a: pytest.fail("probed twice"))
    assert cxx_probe.workaround_flags(cxx, flags, "fake 1.0") == ["-fno-tree-loop-if-convert"]


def test_this_compiler_passes_with_the_flags_kiln_uses(fresh_cache):
    """GCC 12.2 (CI) needs nothing; GCC 13.3 (the GPU machine) needs its loop
    if-conversion off."""
    extra = cxx_probe.workaround_flags(cache.CXX, list(cache.CXXFLAGS), "real")
    assert cxx_probe.failing_probes(cache.CXX, list(cache.CXXFLAGS) + extra) == []
