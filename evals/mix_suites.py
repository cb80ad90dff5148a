"""One eval set drawn from every built-in suite: `python evals/mix_suites.py --per-suite N [--skip S] --out F`.

Takes the first N items of each suite in evals/suites/ (after its first S with `--skip`: a second, disjoint sample;
longcontext left out: its prompts need the long-context strategies), keeps their turns, references and ids, and sets
each item's category to its suite's name, so one `bench --eval-set FILE` run reports every suite as a category of
the same run. The selection is the suites' own order: nothing is chosen by how a strategy does on it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SUITES = Path(__file__).resolve().parent / "suites"
SKIP = {"longcontext"}


def mix(per_suite: int, suites: list[str] | None = None, skip: int = 0) -> list[dict]:
    rows = []
    for f in sorted(SUITES.glob("*.jsonl")):
        if f.stem in SKIP or (suites and f.stem not in suites):
            continue
        items = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
        for d in items[skip:skip + per_suite]:
            rows.append(dict(d, category=f.stem))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-suite", type=int, default=2)
    ap.add_argument("--suites", default="", help="comma list (default: every suite but longcontext)")
    ap.add_argument("--skip", type=int, default=0, help="leave out each suite's first S items")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.per_suite < 1 or a.skip < 0:
        raise SystemExit("--per-suite must be at least 1 and --skip at least 0")
    rows = mix(a.per_suite, [s for s in a.suites.split(",") if s] or None, a.skip)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} items from {len({r['category'] for r in rows})} suites -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
