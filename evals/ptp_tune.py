"""Choose `ptp`'s decoding parameters (drafts k per pass, branch budget) for this machine by measurement.

Runs `ar` and `ptp` over a grid of (k, branches) on held-out TRAINING prompts (paradec.training.prompts,
split "heldout": disjoint from evals/suites and from the prompts the adapter was trained on), greedy, batch 1,
in one process, and prints per configuration: tokens per forward pass, the accepted-count histogram, tokens/s
and the speed-up over ar measured in the same run. Every ptp output is checked token for token against ar.
The benchmark suites are never used here, so the defaults chosen from this table are not tuned on them.

    python evals/ptp_tune.py [--model M] [--prompts 6] [--max-new-tokens 64] [--grid 2:1,3:1,3:2,4:2,5:2,7:3]
                             [--markdown docs/bench/ptp_tune.md] [--write-profile [FOLDER]]

`--write-profile` also writes the adapter's decoding profile (paradec/strategies/ptp.py PROFILE, beside the
adapter unless a folder is given): per configuration the tokens per decode pass and how many decode passes had
how many positions. Those figures are the adapter's and the prompts', not the machine's (the outputs are `ar`'s
token for token on any machine), so `ptp` combines them at run time with the pass costs it measures where it
runs, and picks its (k, branches) there.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paradec.engine import Engine, cpu_name  # noqa: E402
from paradec.race import run_alone  # noqa: E402
from paradec.strategies import Request  # noqa: E402
from paradec.training.prompts import training_prompts  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--grid", default="2:1,3:1,3:2,4:2,5:2,7:3", help="k:branches pairs")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--markdown")
    ap.add_argument("--write-profile", nargs="?", const="", default=None,
                    help="write the decoding profile (default: into the adapter's own folder)")
    args = ap.parse_args(argv)
    e = Engine.load(args.model)
    prompts = training_prompts(args.prompts, args.seed, "heldout")
    grid = [tuple(int(x) for x in g.split(":")) for g in args.grid.split(",")]
    reqs = [Request(messages=p["messages"], max_new_tokens=args.max_new_tokens) for p in prompts]
    warm = Request(messages=prompts[0]["messages"], max_new_tokens=8)    # weights packed on first use, caches
    run_alone(e, "ar", warm)                                              # made: not inside a timed run
    run_alone(e, "ptp", warm, {"k": 1, "branches": 1})
    ar = [run_alone(e, "ar", r) for r in reqs]
    ar_tok = sum(len(x.token_ids) for x in ar)
    ar_s = sum(x.clock for x in ar)
    rows = []
    for k, b in grid:
        infos = []              # each step's info (its positions), from every lane in order
        lanes = [run_alone(e, "ptp", r, {"k": k, "branches": b},
                           on_step=lambda _lane, st: infos.append((st.prefill, len(st.token_ids), st.info)))
                 for r in reqs]
        bad = [lane.error for lane in lanes if lane.error]
        if bad:
            raise SystemExit(f"ptp k={k} branches={b}: {bad[0]}")
        mism = sum(lane.token_ids != a.token_ids for lane, a in zip(lanes, ar))
        toks = sum(len(x.token_ids) for x in lanes)
        passes = sum(s.forward_passes for x in lanes for s in x.steps)
        secs = sum(x.clock for x in lanes)
        decode = [(n, info) for pre, n, info in infos if not pre]         # after the prefill pass
        hist = Counter(n for n, _ in decode)
        widths = Counter(info["positions"] for _, info in decode)
        rows.append({"k": k, "branches": b, "tokens_per_pass": toks / passes, "tok_s": toks / secs,
                     "speedup": (toks / secs) / (ar_tok / ar_s), "mismatches": mism,
                     "hist": dict(sorted(hist.items())),
                     "decode_tokens_per_pass": sum(n for n, _ in decode) / max(1, len(decode)),
                     "widths": dict(sorted(widths.items()))})
        print(rows[-1], flush=True)
    lines = [f"# ptp decoding parameters on this machine ({cpu_name()}, {e.device}, {e.dtype}, "
             f"{torch.get_num_threads()} threads, {datetime.date.today()})", "",
             f"`python evals/ptp_tune.py {' '.join(argv if argv is not None else sys.argv[1:])}`: {len(reqs)} "
             f"held-out training prompts (not the benchmark suites), greedy, {args.max_new_tokens} new tokens, "
             f"batch 1. ar: {ar_tok / ar_s:.2f} tokens/s in the same run.", "",
             "| k | branches | tokens/pass | tokens/s | speed-up vs ar | mismatches vs ar | tokens per step (count) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['branches']} | {r['tokens_per_pass']:.2f} | {r['tok_s']:.2f} | "
                     f"{r['speedup']:.2f}× | {r['mismatches']} | "
                     + ", ".join(f"{n}: {c}" for n, c in r["hist"].items()) + " |")
    if args.write_profile is not None:
        where = write_profile(e, args, rows, len(reqs)).resolve()
        if where.is_relative_to(Path.cwd().resolve()):
            where = where.relative_to(Path.cwd().resolve())          # no machine's absolute path in the page
        lines += ["", f"Decoding profile written to {where}."]
    write_page(lines, args.markdown)
    return 0


def write_page(lines: list[str], markdown: str | None) -> None:
    """Print a tuning table's lines and, with --markdown, write them to that page (evals/sps_tune.py too)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if markdown:
        Path(markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown).write_text(text)


def write_profile(engine, args, rows, n_prompts) -> Path:
    """The decoding profile (tokens per decode pass and decode-pass widths per configuration) beside the adapter."""
    import json
    from paradec import ptp as P
    from paradec.strategies.ptp import PROFILE
    folder = Path(args.write_profile) if args.write_profile else P.adapter_for(engine).folder
    bad = [r for r in rows if r["mismatches"]]
    if bad:
        raise SystemExit(f"not writing a profile: ptp differed from ar ({bad[0]['k']}:{bad[0]['branches']})")
    doc = {"what": "ptp decoding profile: per (k, branches), tokens per decode pass (prefill pass left out) and "
                   "how many decode passes had how many positions; held-out training prompts, greedy, batch 1",
           "made_with": "python evals/ptp_tune.py " + " ".join(sys.argv[1:]),
           "prompts": n_prompts, "max_new_tokens": args.max_new_tokens, "model": engine.name,
           "dtype": str(engine.dtype).replace("torch.", ""), "date": str(datetime.date.today()),
           "measured_on": cpu_name(),
           "configs": [{"k": r["k"], "branches": r["branches"],
                        "tokens_per_pass": round(r["decode_tokens_per_pass"], 4),
                        "widths": {str(w): n for w, n in r["widths"].items()}} for r in rows]}
    tmp = folder / (PROFILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(folder / PROFILE)
    return folder / PROFILE


if __name__ == "__main__":
    raise SystemExit(main())
