"""Held-out figures of LUD parameters, without training: what greedy `lud` (lossy) and `lud-verified` (lossless)
would do at every position of the target's greedy answers to the held-out training prompts (paradec.training.teacher:
prompts from held-out modules, not the benchmark suites), teacher-forced (`lud_train.heldout_figures`).

    python evals/lud_heldout.py [--model M] [--adapter DIR] [--k 5] [--thresholds 0,0.3,0.5,0.7,0.9]
                                [--markdown FILE]

Prints one table per measure against k and threshold: `lud` tokens per pass and its share of wrong steps (a step
that accepts a token the base would not have picked), `lud-verified` tokens per pass (its output is `ar`'s) in its
chain and its branch layout.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target (default: the default model)")
    p.add_argument("--adapter", default=None, help="LUD folder (default: the model's shipped parameters)")
    p.add_argument("--k", type=int, default=0, help="largest k replayed (default: the parameters' own)")
    p.add_argument("--thresholds", default="0,0.3,0.5,0.7,0.9")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--markdown", help="also write the tables here")
    args = p.parse_args(argv)
    import torch

    from paradec.engine import Engine, cpu_name
    from paradec.lud import LUDAdapter
    from paradec.training import lud_train as T
    from paradec.training import teacher as TCH
    engine = Engine.load(args.model, dtype=args.dtype)
    ad = LUDAdapter.require(engine, args.adapter)
    k = args.k or ad.config.k
    ths = tuple(float(t) for t in args.thresholds.split(","))
    held = [r for r in TCH.answers(engine, 0).held if r["greedy"]]
    t0 = time.time()
    with torch.inference_mode():
        figs = T.heldout_figures(engine, ad, held, k, ths)
    by = {(f["k"], f["threshold"]): f for f in figs if f["kind"] == "all"}
    ks = sorted({kk for kk, _t in by})
    head = (f"`python evals/lud_heldout.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
            f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_name()}, {engine.device}, "
            f"{str(engine.dtype).replace('torch.', '')}, {torch.get_num_threads()} threads; "
            f"{time.time() - t0:.0f} s): {len(held)} held-out greedy answers, "
            f"{by[(ks[0], ths[0])]['cuts']} answer positions; LUD parameters: {args.adapter or 'the shipped ones'}")
    lines = [head, "", T.figures_markdown(figs)]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
