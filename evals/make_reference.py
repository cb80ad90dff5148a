"""Ship a benchmark database as the Dashboard's reference dataset.

    python -m evals.make_reference [SRC.db] [DST.db]     (default data/bench.db -> data/reference/reference.db)

SRC is the database `evals/run_benchmarks.sh` fills (the project's own benchmark runs on the default model). The
copy is one self-contained SQLite file (WAL folded in) that the Dashboard offers, labelled and separate from the
user's runs (`paradec/ui/dashboard.py`).
"""
from __future__ import annotations

import sys
from pathlib import Path

from paradec.ui.dashboard import REFERENCE_DB, ROOT, make_reference


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 2 or any(a.startswith("-") for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(args[0]) if args else ROOT / "data" / "bench.db"
    if not src.is_file():
        print(f"error: {src} does not exist (run evals/run_benchmarks.sh first)", file=sys.stderr)
        return 2
    print(f"wrote {make_reference(str(src), args[1] if len(args) > 1 else REFERENCE_DB)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
