"""Train a feature-level (EAGLE) draft for any target: `python -m paradec train eagle --model M`.

The draft (paradec/feature_draft.py) predicts the target's next final hidden state from its current one and the
next token's embedding. Its data are the target's own hidden states:

1. Rows: the target's answers to the training prompt set (paradec.training.teacher: chat requests made from the
   standard library, disjoint from evals/suites; cached and shared with the other trainers), and with
   `--corpus-windows N` N windows of the training corpus (standard-library text and its docstring
   conversations, training modules only), `--corpus-share` of each batch.
2. Features: the target (in `--teacher-dtype`, bfloat16 by default: the dtype it decodes in) reads each row once,
   teacher-forced; its final hidden state at every position is kept (bfloat16, cached in the work folder).
3. Loss at position j (input f_j and token t_{j+1}; answer positions only for answer rows): the cross-entropy of
   the draft's next-token distribution against the target's own, softmax(head(f_{j+1})) restricted to the kept
   vocabulary (exact: the head rows are the target's), plus `--reg` x a smooth-L1 distance between the predicted
   and the true f_{j+1} (per-dimension scaled by the features' spread). Each batch runs twice: once on the true
   features, once with `--ttt-share` of the input features replaced by the draft's own predictions from the first
   run (detached): at decoding time every proposal after the first reads a predicted feature, so the draft learns
   to read its own (the idea of EAGLE-3's training-time test). With `--levels L` > 2 the batch runs L times, run n
   reading (at the same share of positions) what run n - 1 predicted: a tree's third and deeper proposals read
   predictions made from predictions, and those runs train exactly that.
4. AdamW, warm-up and cosine decay, checkpointed every --ckpt-every steps (resumable). Every --eval-every steps,
   on the held-out greedy answers: the share of positions where the draft's argmax is the target's token, reading
   true features (a1: the first proposal of a step), reading its own predicted feature (a2: the second) and a
   prediction made from a prediction (a3: the third and later); the target's token is its argmax over the full
   vocabulary, so a token the draft does not keep counts as a miss.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import draft as D
from .. import feature_draft as FD
from . import checkpoint
from . import teacher as TCH
from .draft_distill import answer_span, choose_vocab, corpus_fill, corpus_windows, coverage, teacher_forced

ROOT = Path(__file__).resolve().parents[2]


def features(engine, seqs: list[tuple[list[int], int]], cache: Path | None, label: str,
             batch: int = 8) -> list[dict]:
    """Each (ids, first) with the target's final hidden states at every position ("feats": (L, hidden),
    bfloat16). Cached in `cache` (when given) per (ids, first), saved as it goes."""
    return teacher_forced(engine, seqs, lambda h, _ids, _first: {"feats": h.to(torch.bfloat16).cpu().clone()},
                          {"model": engine.name, "dtype": str(engine.dtype), "rows": "feats"}, cache,
                          f"features, {label}", batch)


class _Stop(Exception):
    pass


def aux_features(engine, seqs: list[tuple[list[int], int]], layers: list[int], cache: Path | None, label: str,
                 batch: int = 8) -> list[dict]:
    """Each (ids, first) with the input norm outputs of the target's layers `layers` at every position ("aux":
    (L, len(layers) x hidden), bfloat16), the pass stopped after the deepest of them. Cached as `features`."""
    dec = D._decoder(engine.model)

    def forward(x):
        got = {}

        def keep(a):
            def hook(_m, _i, out):
                got[a] = out
                if a == max(layers):
                    raise _Stop
            return hook
        hooks = [dec.layers[a].input_layernorm.register_forward_hook(keep(a)) for a in layers]
        try:
            dec(input_ids=x, use_cache=False)
        except _Stop:
            pass
        finally:
            for h in hooks:
                h.remove()
        return torch.cat([got[a] for a in layers], -1)
    return teacher_forced(engine, seqs, lambda h, _ids, _first: {"aux": h.to(torch.bfloat16).cpu().clone()},
                          {"model": engine.name, "dtype": str(engine.dtype), "rows": "aux", "layers": list(layers)},
                          cache, f"aux features, {label}", batch, forward)


def with_aux(rows: list[dict], aux: list[dict]) -> list[dict]:
    """`features` rows with their `aux_features` ("aux") added (the same (ids, first) in the same order)."""
    for r, a in zip(rows, aux):
        assert r["ids"] == a["ids"] and r["first"] == a["first"]
        r["aux"] = a["aux"]
    return rows


def make_batch(pick: list[dict]):
    """Right-padded (feats (B, L-1, H') f_j, tokens (B, L-1) t_{j+1}, target feats (B, L-1, H) f_{j+1},
    mask (B, L-1): positions j with j + 1 inside the row and j + 1 >= first). H' = H, or with aux features
    (rows with "aux") H + their width: f_j followed by the aux parts."""
    L = max(len(r["ids"]) for r in pick)
    H = pick[0]["feats"].shape[-1]
    A = pick[0]["aux"].shape[-1] if "aux" in pick[0] else 0
    f = torch.zeros(len(pick), L, H + A)
    ids = torch.zeros(len(pick), L, dtype=torch.long)
    mask = torch.zeros(len(pick), L - 1, dtype=torch.bool)
    for i, r in enumerate(pick):
        n = len(r["ids"])
        f[i, :n, :H] = r["feats"].float()
        if A:
            f[i, :n, H:] = r["aux"].float()
        ids[i, :n] = torch.tensor(r["ids"])
        mask[i, max(0, r["first"] - 1):n - 1] = True
    return f[:, :-1], ids[:, 1:], f[:, 1:, :H], mask


def batches(groups: list[tuple[list[dict], float]], batch: int, rng: random.Random):
    shares = [s for _r, s in groups]
    while True:
        yield make_batch([rng.choice(groups[rng.choices(range(len(groups)), shares)[0]][0]) for _ in range(batch)])


def shifted(fin, h):
    """The input features a draft pass reads when it drafts on from its own outputs: at position j the draft's
    prediction made at j - 1, zeros for any aux parts (a prediction has none); position 0 keeps its true
    feature."""
    h = h[:, :-1].detach().to(fin.dtype)
    if h.shape[-1] < fin.shape[-1]:
        h = torch.cat([h, h.new_zeros(*h.shape[:-1], fin.shape[-1] - h.shape[-1])], -1)
    return torch.cat([fin[:, :1], h], 1)


def losses(fd: FD.FeatureDraft, fin, toks, ftgt, mask, scale, reg: float, ttt_share: float,
           gen: torch.Generator | None = None, levels: int = 2) -> tuple[torch.Tensor, dict]:
    """The loss of one batch (module docstring, step 3), the mean over `levels` runs, and its parts.

    Run 1 reads the true features; run n > 1 reads, at `ttt_share` of the positions, the (detached) features run
    n - 1 predicted one position earlier, and the true ones elsewhere: a position whose input was swapped in every
    run from n - d + 1 to n reads what the draft would at its d-th proposal of a step."""
    with torch.no_grad():
        p = torch.softmax(fd.kept_logits(ftgt[mask]).float(), -1)      # the target's own distribution, kept vocab

    def one(inp):
        h = fd.hidden(inp, toks)
        hm = h[mask]
        ce = -(p * torch.log_softmax(fd.kept_logits(hm).float(), -1)).sum(-1).mean()
        rg = F.smooth_l1_loss(hm.float() / scale, ftgt[mask].float() / scale)
        return ce + reg * rg, h, ce
    total, h, ce = one(fin)
    parts = {"ce1": float(ce.detach())}
    n = levels if ttt_share > 0 else 1
    for lvl in range(2, n + 1):
        swap = torch.rand(mask.shape, generator=gen) < ttt_share
        swap[:, 0] = False
        l, h, ce = one(torch.where(swap[..., None], shifted(fin, h), fin))
        total = total + l
        parts[f"ce{lvl}"] = float(ce.detach())
    return total / n, parts


@torch.no_grad()
def acceptance(fd: FD.FeatureDraft, rows: list[dict]) -> dict:
    """On held-out rows (answer positions): a1 = draft argmax reading the true f_j == the target's argmax at j+1
    (the first proposal of a step), a2 = the same reading its own predicted f^_j (the second proposal), a3 =
    reading the prediction made from a prediction (the third and later). The target's argmax is over its full
    vocabulary (a token outside the draft's kept ones counts as a miss, as in decoding)."""
    head = fd.target.model.get_output_embeddings()
    hit = [0, 0, 0]
    tot = 0
    for r in rows:
        fin, toks, ftgt, mask = make_batch([r])
        if not mask.any():
            continue
        tgt = head(ftgt[mask].to(head.weight.dtype)).argmax(-1)
        inp = fin
        for i in range(3):
            h = fd.hidden(inp, toks)
            hit[i] += int((fd.kept_ids[fd.kept_logits(h[mask]).argmax(-1)] == tgt).sum())
            inp = shifted(fin, h)                # every input the prediction made one position back
        tot += int(mask.sum())
    a1, a2, a3 = (x / max(1, tot) for x in hit)
    # expected tokens per target pass of a k = 4 chain if proposals were accepted independently at these rates
    tpp = 1 + a1 * (1 + a2 + a2 * a3 + a2 * a3 ** 2)
    return {"a1": round(a1, 4), "a2": round(a2, 4), "a3": round(a3, 4), "tokens_per_pass_k4": round(tpp, 3),
            "positions": tot}


def report(fd: FD.FeatureDraft, held: list[dict], ho: list[dict], rows: list[dict], tr: list[dict],
           fit_rows: int = 72) -> dict:
    """The card's acceptance per kind of prompt (held-out greedy answers) and, on `fit_rows` of the training
    greedy answers (every n-th, so spread over the set), the same figures the draft reaches on what it was
    trained on: the gap between the two is how much it memorised rather than learned."""
    def grouped(src, feats):
        g: dict[str, list] = {}
        for r, f in zip(src, feats):
            g.setdefault(r.get("kind", "?"), []).append(f)
        return g
    fit = [f for r, f in zip(rows, tr) if r["greedy"]]
    fit = fit[::max(1, len(fit) // fit_rows)][:fit_rows]
    return {"heldout_by_kind": {k: acceptance(fd, v) for k, v in sorted(grouped(held, ho).items())},
            "train_fit": acceptance(fd, fit)}


def recard(out: Path, fd: FD.FeatureDraft, held, ho, rows, tr) -> Path:
    """Add `report`'s figures to the draft folder's config and rewrite its card."""
    cfg_path = Path(out) / D.CONFIG
    cfg = json.loads(cfg_path.read_text())
    cfg.update(report(fd, held, ho, rows, tr))
    cfg_path.write_text(json.dumps(cfg, indent=1, default=str) + "\n")
    return write_card(out)


def train(args) -> Path:
    from ..engine import Engine, cpu_name
    torch.manual_seed(args.seed)
    engine = Engine.load(args.model, dtype="float32")
    out = Path(args.out) if args.out else FD.shipped_dir(engine.name)
    work = Path(args.work) if args.work else ROOT / "data" / "work" / f"{engine.name}-eagle"
    work.mkdir(parents=True, exist_ok=True)
    ans = TCH.answers(engine, args.prompts, args.eval_prompts, args.seed, args.max_prompt, args.gen_tokens,
                      args.gen_batch, args.teacher_cache, args.sampled_prompts)
    rows, held = ans.rows, [r for r in ans.held if r["greedy"]]
    init = None
    if args.card_only:
        args.init = str(out)                           # the draft to measure: its vocabulary, no training
    if args.init:
        try:
            init = FD.read(args.init, engine)
        except ValueError as e:
            raise SystemExit(f"--init: {e}") from e
        kept = init.kept_ids.tolist()                  # the vocabulary it was trained with
    else:
        kept = choose_vocab(rows, args.vocab, set(engine.eos_ids), corpus_fill(engine, args.fill_chars))
    aux = args.aux_layers if args.aux_layers is not None and not args.card_only else (init.aux if init else [])
    if init is not None and init.aux and init.aux != aux:
        raise SystemExit(f"--aux-layers {aux}: the draft in {args.init} reads layers {init.aux}")
    cov = {"train": round(coverage(rows, kept), 4), "heldout": round(coverage(ans.held, kept), 4)}
    print(f"vocabulary {len(kept)}: coverage of answer tokens train {cov['train']}, held-out {cov['heldout']}",
          file=sys.stderr)

    dt = args.teacher_dtype
    teach = engine if dt == "float32" else Engine.load(args.model, dtype=dt)
    t0 = time.time()
    tr = features(teach, [answer_span(r, args.max_len) for r in rows], work / f"features_answers_{dt}.pt",
                  "answers")
    ho = features(teach, [answer_span(r, args.max_len) for r in held], work / f"features_heldout_{dt}.pt",
                  "held-out")
    if aux:
        tag = "-".join(map(str, aux))
        with_aux(tr, aux_features(teach, [answer_span(r, args.max_len) for r in rows], aux,
                                  work / f"aux{tag}_answers_{dt}.pt", "answers"))
        with_aux(ho, aux_features(teach, [answer_span(r, args.max_len) for r in held], aux,
                                  work / f"aux{tag}_heldout_{dt}.pt", "held-out"))
    groups = [(tr, 1.0 - args.corpus_share if args.corpus_windows else 1.0)]
    if args.corpus_windows:
        wins = corpus_windows(teach, args.corpus_windows, args.max_len, args.seed)
        cw = features(teach, [(w, 0) for w in wins], work / f"features_corpus_{dt}.pt", "corpus")
        if aux:
            with_aux(cw, aux_features(teach, [(w, 0) for w in wins], aux, work / f"aux{tag}_corpus_{dt}.pt",
                                      "corpus"))
        groups.append((cw, args.corpus_share))
    feat_min = round((time.time() - t0) / 60, 1)
    if teach is not engine:
        del teach
    data_desc = (f"{ans.description}; the target's final hidden states ({dt}, teacher-forced) at every position of "
                 f"those answers" + (f" and of {len(groups[-1][0])} windows of up to {args.max_len} tokens of the "
                                     f"training corpus (training modules only), {args.corpus_share:.0%} of each "
                                     f"batch" if args.corpus_windows else "")
                 + (f", with the input norm outputs of its layers {', '.join(map(str, aux))} beside them"
                    if aux else "")
                 + f"; features took {feat_min} min (0 when cached)")
    print(data_desc, file=sys.stderr, flush=True)
    if args.card_only:
        recard(out, init, held, ho, rows, tr)
        print(f"wrote {out / 'README.md'}", file=sys.stderr)
        return out
    allf = torch.cat([r["feats"][:64].float() for r in tr[:200]])
    scale = allf.std(0).clamp(min=1e-3)

    ckpt = work / "eagle_checkpoint.pt"
    st = checkpoint.load(ckpt)
    struct = {"source": args.source, "kept": kept, "reg": args.reg, "ttt": args.ttt_share, "levels": args.levels,
              "corpus_windows": args.corpus_windows, "corpus_share": args.corpus_share,
              "init": str(Path(args.init).resolve()) if args.init else None, "aux": aux}
    if st is not None and st.get("struct") == struct:
        fd = FD.FeatureDraft.from_state(engine, st["config"], st["draft"], kept)
        print(f"resuming from step {st['step']}", file=sys.stderr)
    elif init is not None:
        st, fd = None, init
        print(f"continuing from {args.init} ({init.meta.get('steps')} steps)", file=sys.stderr)
    else:
        st = None
        fd = FD.FeatureDraft.from_target(engine, kept, args.source)
    if st is None and fd.aux != aux:
        try:
            fd.widen(aux)                              # zero weights on the new inputs: starts where it was
        except ValueError as e:
            raise SystemExit(f"--aux-layers: {e}") from e
        print(f"reading the target's layers {aux} besides its final hidden state", file=sys.stderr)
    for prm in engine.model.parameters():
        prm.requires_grad_(False)
    params = fd.trainable()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    run = {"step": 0, "curve": [], "elapsed": 0.0}
    if st is not None:
        opt.load_state_dict(st["opt"])
        run = {k: st[k] for k in run}
        torch.set_rng_state(st["torch_rng"])
    curve = run["curve"]
    data = batches(groups, args.batch, random.Random(args.seed * 1000 + run["step"]))
    gen = torch.Generator().manual_seed(args.seed * 1000 + run["step"])

    def save(final=False):
        meta = {"base_model": engine.name, "trained_with": "python -m paradec train eagle " + " ".join(args.argv),
                "steps": run["step"], "train_minutes": round(run["elapsed"] / 60, 2),
                "teacher_minutes": ans.minutes_for_card(), "feature_minutes": feat_min,
                "hardware": f"{cpu_name()}, {torch.get_num_threads()} thread(s), {engine.device} (float32)",
                "data": data_desc, "vocab_coverage": cov, "lr": args.lr, "batch": args.batch,
                "max_len": args.max_len, "reg": args.reg, "ttt_share": args.ttt_share, "levels": args.levels,
                "curve": curve,
                "init": ({"folder": args.init, "steps": init.meta.get("steps"),
                          "train_minutes": init.meta.get("train_minutes"), "heldout": init.meta.get("heldout")}
                         if init is not None else None),
                "complete": final, "heldout": curve[-1] if curve else None}
        fd.save(out, meta)
        checkpoint.save(ckpt, {"struct": struct, "config": fd.config_dict(), "draft": fd.state(),
                               "opt": opt.state_dict(), **run, "torch_rng": torch.get_rng_state()})

    if not curve:
        curve.append({"step": 0, **acceptance(fd, ho)})
        print(curve[-1], file=sys.stderr, flush=True)
    checkpoint.run_steps(args, run, opt, params,
                         lambda: losses(fd, *next(data), scale, args.reg, args.ttt_share, gen, args.levels),
                         lambda: acceptance(fd, ho), save, "eagle")
    save(final=True)
    recard(out, fd, held, ho, rows, tr)
    print(f"wrote {out}", file=sys.stderr)
    return out


def write_card(folder: Path) -> Path:
    """README.md for a feature-draft folder, from its draft_config.json (this run's own figures)."""
    cfg = json.loads((Path(folder) / D.CONFIG).read_text())
    curve = cfg.get("curve") or []
    last = curve[-1] if curve else {}
    size = (Path(folder) / D.WEIGHTS).stat().st_size
    lines = [f"# Feature-level (EAGLE) draft for `{cfg['base_model']}`", "",
             "The draft `eagle` decodes with (paradec/feature_draft.py): fc("
             + (f"{2 + len(cfg['aux_layers'])} x hidden -> hidden) over the target's final hidden state, the input "
                f"norm outputs of its layers {', '.join(map(str, cfg['aux_layers']))} (EAGLE-3's fused features)"
                if cfg.get("aux_layers") else "2 x hidden -> hidden) over the target's final hidden state")
             + " and the next token's embedding, one decoder layer (initialised from the target's "
             f"layer {cfg['source_layer']}, MLP {cfg['intermediate_size']}), the target's final norm (trained), and "
             f"the target's head rows for {cfg['kept_tokens']} tokens (coverage of answer tokens: "
             f"{cfg.get('vocab_coverage')}). File: {size / 1e6:.1f} MB (bfloat16).", "",
             f"- Trained with: `{cfg.get('trained_with')}`", f"- Data: {cfg.get('data')}",
             f"- Loss: cross-entropy against the target's distribution + {cfg.get('reg')} x smooth-L1 on the "
             f"features; {cfg.get('levels', 2)} runs per batch, each after the first with {cfg.get('ttt_share')} "
             f"of the input features the previous run's predictions",
             f"- Steps: {cfg.get('steps')} x batch {cfg.get('batch')} (rows of at most {cfg.get('max_len')} tokens), "
             f"lr {cfg.get('lr')}" + (f", continuing a draft of {cfg['init'].get('steps')} steps "
                                      f"({cfg['init'].get('train_minutes')} min; held-out then "
                                      f"{cfg['init'].get('heldout')}) from `{cfg['init'].get('folder')}`"
                                      if cfg.get("init") else ""),
             f"- Time: {TCH.time_text(cfg.get('train_minutes'), cfg.get('teacher_minutes'))}; features "
             f"{cfg.get('feature_minutes')} min; hardware: {cfg.get('hardware')}",
             f"- Held-out greedy answers ({last.get('positions')} positions): a1 (first proposal, true features) "
             f"{last.get('a1')}, a2 (second proposal, own features) {last.get('a2')}, a3 (third and later, "
             f"predictions of predictions) {last.get('a3', 'not measured')}", "",
             "| step | loss | a1 | a2 | a3 | tokens/pass (k 4, independent) |", "|---|---|---|---|---|---|"]
    lines += [f"| {c.get('step')} | {c.get('loss', '')} | {c.get('a1')} | {c.get('a2')} | {c.get('a3', '')} | "
              f"{c.get('tokens_per_pass_k4')} |" for c in curve]
    kinds = cfg.get("heldout_by_kind") or {}
    if kinds:
        fit = cfg.get("train_fit") or {}
        lines += ["", "Acceptance per kind of prompt (held-out greedy answers; last row: training greedy answers, the "
                  "same measure on what the draft was trained on):", "",
                  "| kind | positions | a1 | a2 | a3 | tokens/pass (k 4, independent) |", "|---|---|---|---|---|---|"]
        lines += [f"| {k} | {v['positions']} | {v['a1']} | {v['a2']} | {v['a3']} | {v['tokens_per_pass_k4']} |"
                  for k, v in kinds.items()]
        if fit:
            lines.append(f"| training answers | {fit['positions']} | {fit['a1']} | "
                         f"{fit['a2']} | {fit['a3']} | {fit['tokens_per_pass_k4']} |")
    lines += ["", "Decoding with it is lossless whatever its quality: the target verifies every drafted token over "
              "its full vocabulary; tokens outside the kept vocabulary get probability 0 in q, which rejection "
              "sampling handles exactly."]
    path = Path(folder) / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paradec train eagle",
                                description="Train a feature-level (EAGLE) draft: one decoder layer that reads the "
                                            "target's own hidden states.")
    p.add_argument("--model", default=None, help="target model (default: the default model)")
    p.add_argument("--source", type=int, default=-1, help="target layer the draft's layer starts from (-1 = last)")
    p.add_argument("--aux-layers",
                   help="comma-separated target layers whose input norm outputs the draft reads besides the final "
                        "hidden state (EAGLE-3's fused features; e.g. 6,12); default: those of --init, else none")
    p.add_argument("--vocab", type=int, default=16384, help="draft vocabulary size (most frequent answer tokens)")
    p.add_argument("--fill-chars", type=int, default=3_000_000,
                   help="corpus characters whose frequent tokens fill the vocabulary after the answers' and prompts'")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--reg", type=float, default=0.2, help="weight of the feature regression")
    p.add_argument("--ttt-share", type=float, default=0.5,
                   help="share of input features replaced by the draft's own in each run after the first "
                        "(0 = one run)")
    p.add_argument("--levels", type=int, default=2,
                   help="runs per batch, each reading the previous run's predictions (2: one level of "
                        "training-time test; 3+: deeper proposals too)")
    p.add_argument("--corpus-windows", type=int, default=0, help="training-corpus windows added to the answers")
    p.add_argument("--corpus-share", type=float, default=0.25, help="share of each batch drawn from those windows")
    p.add_argument("--teacher-dtype", default="bfloat16", help="dtype of the target when it makes the features")
    p.add_argument("--prompts", type=int, default=288, help="training prompts answered by the target")
    TCH.add_cache_args(p)
    p.add_argument("--eval-prompts", type=int, default=36)
    p.add_argument("--max-prompt", type=int, default=320, help="prompt tokens kept (the tail)")
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--gen-batch", type=int, default=48)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--max-minutes", type=float, help="stop (and save) after this much wall time")
    p.add_argument("--init", help="continue from the feature draft in this folder (its weights and vocabulary; "
                                  "the optimiser and the learning-rate schedule start afresh)")
    p.add_argument("--out", help="draft folder (default data/drafts/<model>/eagle)")
    p.add_argument("--work", help="checkpoint and feature folder (default data/work/<model>-eagle)")
    p.add_argument("--card-only", action="store_true",
                   help="train nothing: measure the draft in --out per kind of prompt (cached answers and features) "
                        "and rewrite its card")
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.corpus_windows < 0 or args.steps < 1 or args.batch < 1:
        parser.error("--corpus-windows must be >= 0, --steps and --batch >= 1")
    if not 0.0 < args.corpus_share < 1.0:
        parser.error(f"--corpus-share must lie strictly between 0 and 1, got {args.corpus_share}")
    if not 0.0 <= args.ttt_share <= 1.0:
        parser.error(f"--ttt-share must lie between 0 and 1, got {args.ttt_share}")
    if not 1 <= args.levels <= 6:
        parser.error(f"--levels must lie between 1 and 6, got {args.levels}")
    try:
        args.aux_layers = ([int(a) for a in args.aux_layers.split(",") if a.strip()]
                           if args.aux_layers is not None else None)
    except ValueError:
        parser.error(f"--aux-layers must be comma-separated layer numbers, got {args.aux_layers!r}")
    args.argv = list(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
