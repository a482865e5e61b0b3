"""``python -m kiln.replay FILE``: re-run a failed capture recorded with
``KILN_REPLAY_RECORD=1`` (the work is in ``kiln/debug/replay.py``)."""
from __future__ import annotations

import sys

from kiln.debug.replay import main

if __name__ == "__main__":
    sys.exit(main())
