"""Ship a benchmark database as the Dashboard's reference dataset.

    python -m evals.make_reference [SRC.db] [DST.db]     (default data/bench.db -> data/reference/reference.db)
    python -m evals.make_reference --add SRC.db [DST.db]  append SRC's runs to the shipped reference instead

SRC is the database `evals/run_benchmarks.sh` fills (the project's own benchmark runs on the default model). The
copy is one self-contained SQLite file (WAL folded in) that the Dashboard offers, labelled and separate from the
user's runs (`paradec/ui/dashboard.py`). `--add` keeps the runs the reference already holds (e.g. those of another
machine, whose database is gone) and appends every run of SRC with its eval set and items, results and step
events, under new ids, in one transaction: a failure leaves the reference as it was.
"""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from paradec.ui.dashboard import REFERENCE_DB, ROOT, make_reference

# table -> (its foreign key column, the table that column points into), in insertion order
LINKS = (("eval_sets", None, None), ("eval_items", "eval_set_id", "eval_sets"), ("runs", "eval_set_id", "eval_sets"),
         ("results", "run_id", "runs"), ("step_events", "result_id", "results"))


def add_runs(src: str | Path, dst: str | Path) -> int:
    """Append every run of the database `src` (and what it refers to) to the database `dst`; returns the count."""
    with sqlite3.connect(src) as a:
        a.execute("PRAGMA wal_checkpoint(FULL)")
    b = sqlite3.connect(dst)
    try:
        b.execute("ATTACH DATABASE ? AS src", (str(src),))
        new_ids: dict[str, dict[int, int]] = {}
        with b:                                              # one transaction
            for table, fk, parent in LINKS:
                theirs = [r[1] for r in b.execute(f"PRAGMA src.table_info({table})")]
                ours = {r[1] for r in b.execute(f"PRAGMA main.table_info({table})")}
                keep = [c for c in theirs if c != "id" and c in ours]
                if not keep:                                 # a table one side lacks (an older schema): nothing
                    continue
                quoted = ", ".join(f'"{c}"' for c in keep)
                ids = new_ids.setdefault(table, {})
                for row in b.execute(f'SELECT id, {quoted} FROM src."{table}" ORDER BY id').fetchall():
                    values = dict(zip(keep, row[1:]))
                    if fk and values.get(fk) is not None:
                        values[fk] = new_ids.get(parent, {}).get(values[fk])
                    cur = b.execute(f'INSERT INTO main."{table}" ({quoted}) VALUES ({", ".join("?" * len(keep))})',
                                    [values[c] for c in keep])
                    ids[row[0]] = cur.lastrowid
        b.execute("DETACH DATABASE src")
        return len(new_ids["runs"])
    finally:
        b.close()


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    add = args[:1] == ["--add"]
    args = args[1:] if add else args
    if len(args) > 2 or any(a.startswith("-") for a in args) or (add and not args):
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(args[0]) if args else ROOT / "data" / "bench.db"
    if not src.is_file():
        print(f"error: {src} does not exist (run evals/run_benchmarks.sh first)", file=sys.stderr)
        return 2
    dst = args[1] if len(args) > 1 else REFERENCE_DB
    if add:
        if not Path(dst).is_file():
            print(f"error: {dst} does not exist: make it first without --add", file=sys.stderr)
            return 2
        print(f"added {add_runs(src, dst)} runs of {src} to {dst}")
        return 0
    print(f"wrote {make_reference(str(src), dst)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
