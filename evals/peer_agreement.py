"""How often another engine's greedy text equals paradec `ar`'s, in one stored bench run with `--peer` lanes.

    python evals/peer_agreement.py --db data/bench.db --run ID [--out docs/bench/NAME.json]

A peer (llama.cpp on the Q5_0 GGUF, vLLM on the same float32 folder) computes with other kernels and maybe other
weights' precision, so its greedy text may part from `ar`'s: this is information, not a pass/fail. For every lane
other than `ar`, over the turns both answered: how many texts are identical, and how many characters the two texts
share from the start (the point where the answers part), as a median and as a fraction of `ar`'s text.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def agreement(results: list[dict]) -> dict:
    """{lane: {turns, identical, shared_chars_p50, shared_fraction_mean}} against the `ar` rows of the same run."""
    ar = {(r["item_key"], r["repeat"], r["turn"]): r["text"] or "" for r in results
          if r["strategy"] == "ar" and not r.get("error")}
    out: dict[str, dict] = {}
    for lane in sorted({r["strategy"] for r in results} - {"ar"}):
        shared, frac, same = [], [], 0
        for r in results:
            key = (r["item_key"], r["repeat"], r["turn"])
            if r["strategy"] != lane or r.get("error") or key not in ar:
                continue
            a, b = ar[key], r["text"] or ""
            same += a == b
            k = common_prefix(a, b)
            shared.append(k)
            frac.append(k / len(a) if a else float(a == b))
        if shared:
            out[lane] = {"turns": len(shared), "identical": same, "shared_chars_p50": statistics.median(shared),
                         "shared_fraction_mean": round(sum(frac) / len(frac), 3)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="data/bench.db")
    ap.add_argument("--run", type=int, required=True)
    ap.add_argument("--out", help="write the JSON here too")
    a = ap.parse_args(argv)
    from paradec.store import Store
    store = Store(a.db)
    if store.get_run(a.run) is None:
        raise SystemExit(f"error: no run {a.run} in {a.db}")
    res = agreement(store.get_results(a.run))
    text = json.dumps({"run": a.run, "lanes": res}, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
