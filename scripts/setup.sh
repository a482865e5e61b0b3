#!/usr/bin/env bash
# Create .venv at the repository root with everything kiln and its tests need.
# torch/torchvision come from this machine's local wheel store (pip's cap); the rest
# from PyPI. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PY=.venv/bin/python
if ! $PY -c "import torch, torchvision" >/dev/null 2>&1; then
  $PY -m pip install -q torch==2.14.1 torchvision==0.29.1
fi
$PY -m pip install -q bytecode networkx sympy numpy scipy pytest pytest-xdist transformers timm matplotlib tabulate
$PY -c "import torch, bytecode, transformers; print('kiln setup: torch', torch.__version__, '| bytecode', bytecode.__version__, '| transformers', transformers.__version__)"
# kiln's C++ tensor guards, built once per installation (kiln/capture/native_guards.py);
# without a compiler kiln keeps its Python guards, so this never fails the set-up
$PY -c "from kiln.capture.native_guards import main; main()" || true
# Headless Chromium renders the KILN_TRACE report in tests/debug/test_html_report.py
# (skipped without it). Best effort: only as root with apt-get, never failing the setup;
# KILN_SETUP_NO_CHROMIUM=1 skips it.
if [ -z "${KILN_SETUP_NO_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1 \
    && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
    >/dev/null 2>&1 || echo "kiln setup: chromium not installed (the report's browser test will skip)"
fi
