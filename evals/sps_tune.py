"""Compare `sps`'s k rules (and fixed k) on this machine by measurement, on held-out TRAINING prompts.

Runs `ar` and `sps` under each configuration on held-out training prompts (paradec.training.prompts, split
"heldout": disjoint from evals/suites and from the prompts the draft was trained on), greedy, batch 1, in one
process, the configurations interleaved prompt by prompt (so a slow spell of the machine does not land on one),
and prints per configuration: tokens per target pass, draft passes per token, drafting's share of the generation
time (the strategy's own draft_s per step, for sps and eagle), tokens/s and the speed-up over ar
in the same run. Every sps output is checked token for token against ar. The benchmark suites are never read.
A configuration with "strategy": "eagle" runs the feature-level draft instead (its other keys are eagle's
parameters; `--eagle FOLDER` picks a feature draft other than the shipped one for all of them, a "folder" key for
one of them, so two drafts meet in one run; an sps configuration's "draft" key does the same for token-level
drafts).

    python evals/sps_tune.py [--model M] [--dtype float32] [--draft FOLDER] [--eagle FOLDER] [--prompts 12]
        [--max-new-tokens 64]
        [--configs '{"rule": "cost"};{"rule": "transformers"};{"adaptive": false, "k": 2};{"strategy": "eagle"}']
        [--markdown docs/bench/sps_tune.md]
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paradec.engine import Engine, cpu_name  # noqa: E402
from paradec.race import run_alone  # noqa: E402
from paradec.strategies import Request  # noqa: E402
from paradec.training.prompts import KINDS, training_prompts  # noqa: E402
from evals.ptp_tune import write_page  # noqa: E402

CONFIGS = '{"rule": "cost"};{"rule": "transformers"};{"adaptive": false, "k": 1};{"adaptive": false, "k": 2};' \
          '{"adaptive": false, "k": 4}'


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--dtype", help="the target's dtype (default: the engine's choice for this machine)")
    ap.add_argument("--draft", default="", help="draft folder (default: the model's shipped draft)")
    ap.add_argument("--eagle", default="", help="feature-draft folder for eagle configurations (default: shipped)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--configs", default=CONFIGS, help="sps parameter sets (JSON objects) separated by ';'")
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--kinds", default="", help="comma-separated prompt kinds (default: all, in turn)")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    configs = [json.loads(c) for c in args.configs.split(";") if c.strip()]
    if args.draft:
        configs = [{**c, "draft": args.draft} if c.get("strategy", "sps") == "sps" else c for c in configs]
    strategies = [c.pop("strategy", "sps") for c in configs]
    e = Engine.load(args.model, dtype=args.dtype)
    from paradec import feature_draft
    from paradec.strategies.eagle import feature_draft as shipped_eagle
    folders = [c.pop("folder", args.eagle) if st == "eagle" else "" for st, c in zip(strategies, configs)]
    drafts = {f: feature_draft.load(f, e) for f in set(folders) if f}
    if any(st == "eagle" and not f for st, f in zip(strategies, folders)):
        drafts[""] = shipped_eagle(e)

    def run_cfg(st, r, c, folder):
        if st == "eagle":
            e.extras["eagle"] = drafts[folder]
        return run_alone(e, st, r, c)
    kinds = [k for k in args.kinds.split(",") if k] or KINDS
    if set(kinds) - set(KINDS):
        ap.error(f"unknown kinds {sorted(set(kinds) - set(KINDS))}; known: {', '.join(KINDS)}")
    prompts = training_prompts(args.prompts, args.seed, "heldout", kinds=kinds)
    reqs = [Request(messages=p["messages"], max_new_tokens=args.max_new_tokens) for p in prompts]
    warm = Request(messages=prompts[0]["messages"], max_new_tokens=8)    # weights packed, pass costs measured
    run_alone(e, "ar", warm)
    for st, c, f in zip(strategies, configs, folders):
        run_cfg(st, warm, c, f)
    names = ["ar"] + [(st + " " if st != "sps" else "") + json.dumps({k: v for k, v in c.items() if k != "draft"})
                      + (f" ({f})" if f and f != args.eagle else "")
                      + (f" (draft {c['draft']})" if c.get("draft") and c["draft"] != args.draft else "")
                      for st, c, f in zip(strategies, configs, folders)]
    if len(set(names)) < len(names):
        raise SystemExit(f"two configurations would share a row: {names}")
    lanes = {n: [] for n in names}
    for r in reqs:
        lanes["ar"].append(run_alone(e, "ar", r))
        for n, st, c, f in zip(names[1:], strategies, configs, folders):
            lanes[n].append(run_cfg(st, r, c, f))
    ar_tok = sum(len(x.token_ids) for x in lanes["ar"])
    ar_speed = ar_tok / sum(x.clock for x in lanes["ar"])
    rows = []
    for n in names[1:]:
        ls = lanes[n]
        bad = [x.error for x in ls if x.error]
        if bad:
            raise SystemExit(f"{n}: {bad[0]}")
        toks = sum(len(x.token_ids) for x in ls)
        passes = sum(s.forward_passes for x in ls for s in x.steps)
        drafts = sum(s.draft_passes for x in ls for s in x.steps)
        speed = toks / sum(x.clock for x in ls)
        share = sum(s.draft_s for x in ls for s in x.steps) / sum(x.clock for x in ls)
        rows.append({"config": n, "tokens_per_pass": toks / passes if passes else None,   # None: not reported
                     "draft_passes_per_token": drafts / toks,
                     "draft_share": share,
                     "tok_s": speed, "speedup": speed / ar_speed,
                     "mismatches": sum(x.token_ids != a.token_ids for x, a in zip(ls, lanes["ar"]))})
        print(rows[-1], flush=True)
    draft = args.draft or "the shipped draft"
    lines = [f"# sps k rules on this machine ({cpu_name()}, {e.device}, {e.dtype}, {torch.get_num_threads()} "
             f"threads, {datetime.date.today()})", "",
             f"`python evals/sps_tune.py {shlex.join(argv if argv is not None else sys.argv[1:])}`: {len(reqs)} "
             f"held-out training prompts{' of kinds ' + ', '.join(kinds) if args.kinds else ''} (not the benchmark "
             f"suites), greedy, {args.max_new_tokens} new tokens, batch 1, draft: {draft}"
             f"{'; eagle: ' + args.eagle if args.eagle else ''}. ar: {ar_speed:.2f} tokens/s in the same run.", "",
             "| sps parameters (or strategy and its parameters) | tokens/pass | draft passes/token | drafting's share "
             "of the time | tokens/s | speed-up vs ar | mismatches vs ar |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        tpp = f"{r['tokens_per_pass']:.2f}" if r["tokens_per_pass"] is not None else "–"
        lines.append(f"| `{r['config']}` | {tpp} | {r['draft_passes_per_token']:.2f} | "
                     f"{100 * r['draft_share']:.1f}% | {r['tok_s']:.2f} | {r['speedup']:.2f}× | {r['mismatches']} |")
    write_page(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
