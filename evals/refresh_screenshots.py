"""Refresh the README's screenshots (docs/*.png) from the browser test.

    python -m evals.refresh_screenshots [pytest args...]

Runs tests/test_browser.py (real Chromium, the default model) with PARADEC_REFRESH_DOCS=1, which copies the
screenshots it takes (artifacts/screenshots/) into docs/. A plain test run never touches docs/.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = {**os.environ, "PARADEC_REFRESH_DOCS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.call([sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_browser.py"), "-q", *args],
                           cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
