#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run kiln's tests. `--quick` skips tests marked slow
# (real models, long runs) and runs on two workers (pytest-xdist): under 5 minutes on 2
# cores. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=()
if [ "${1:-}" = "--quick" ]; then
  shift
  args+=(-m "not slow" -n 2)
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "${args[@]}" "$@" tests
