# The hostile-input regression suite (issue 10): each case that once crashed, pinned or starved osprey, replayed
# through the real binaries. Server fixtures come from tests/serve/serve_support.py.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serve_support import *  # noqa: F401,F403,E402
