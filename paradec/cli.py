"""`python -m paradec`: model, generate, race, strategies, bench, serve and train."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _card(model_dir, what: str) -> None:
    from .engine import Engine
    from .training import card
    rates = card.format_rates(Engine.load(str(model_dir))) if what == "default" else None
    path = card.write_card(model_dir, f"python -m paradec train {what}", rates)
    print(f"wrote {path}" + (f": {rates}" if rates else ""), file=sys.stderr)


def _train(args) -> int:
    from .training import lm
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    if args.what == "card":    # rewrite a model card from its training_summary.json (and re-measure rates)
        from .training import lm
        kind = "draft" if "draft" in (args.name or "") else "default"
        _card(Path(args.out) if args.out else lm.MODELS / (args.name or "paradec-tiny"), kind)
        return 0
    if args.what == "router":
        import json

        from .router import train_router
        meta = train_router()
        print(json.dumps(meta, indent=1, default=str)[:2000])
        return 0
    if args.what in ("default", "draft", "smoke"):
        name = args.name or {"default": "paradec-tiny", "draft": "paradec-tiny-draft",
                             "smoke": "paradec-smoke"}[args.what]
        defaults = {"default": dict(steps=700), "draft": dict(steps=600, lr=3e-3),
                    "smoke": dict(steps=5, batch_size=2, seq_len=64, ckpt_every=2, eval_batches=1)}[args.what]
        cfg = lm.TrainConfig(name=name, arch=args.what, **defaults)
        if args.steps:
            cfg.steps = args.steps
        tok_from = None
        if args.what == "draft":
            tok_from = Path(args.tokenizer_from or lm.MODELS / "paradec-tiny")
        elif args.tokenizer_from:
            tok_from = Path(args.tokenizer_from)
        out = Path(args.out) if args.out else None
        work = Path(args.work) if args.work else None
        lm.train(cfg, out_dir=out, tokenizer_from=tok_from, work=work)
        if args.what != "smoke":
            _card(out or lm.MODELS / name, args.what)
        return 0
    raise SystemExit(f"unknown training target {args.what!r}")


def _model_args(p):
    p.add_argument("--model", help="local model folder, hub id, or paradec-tiny (default: Qwen2.5-Coder-0.5B-Instruct, "
                   "provisioned on first use)")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:1, mps")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA and on CPUs with native bf16 matrix support, "
                   "fp32 otherwise), float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model folder")
    p.add_argument("--engine", metavar="URL", help="use a remote engine: `paradec serve` or any OpenAI-compatible "
                   "server (vLLM, SGLang, TGI); timings are then taken client-side")
    p.add_argument("--engine-token", help="bearer token for --engine (default $PARADEC_TOKEN)")


def _gen_args(p):
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--raw", action="store_true", help="raw completion: do not apply the chat template")
    p.add_argument("--max-context", type=int, default=0, metavar="N",
                   help="context window in tokens (0 = the model's own): a smaller one evaluates long-context "
                        "strategies beyond their window on a model whose real context is larger")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="strategy parameter (repeatable), e.g. --param k=6")


def _parse_params(pairs) -> dict:
    import json
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"--param expects KEY=VALUE, got {pair!r}")
        k, v = pair.split("=", 1)
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def make_request(args, prompt: str):
    from .strategies import Request
    return Request(prompt=prompt, chat=not args.raw, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                   stop=list(args.stop), ignore_eos=args.ignore_eos, params=_parse_params(args.param),
                   max_context=args.max_context)


def load_engine(args):
    import os

    from .engine import Engine
    if getattr(args, "engine", None):
        from .remote import RemoteEngine
        eng = RemoteEngine(args.engine, token=args.engine_token or os.environ.get("PARADEC_TOKEN"), model=args.model)
        eng.describe()    # fails early and clearly when the server is unreachable
        return eng
    return Engine.load(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)


def _generate(args) -> int:
    import json

    from .strategies import length_check_engine
    from .race import run_alone
    engine = load_engine(args)
    req = make_request(args, args.prompt)
    req.validate(length_check_engine(engine, args.strategy))

    def show(lane, step):
        if not args.json:
            sys.stdout.write(step.text)
            sys.stdout.flush()

    lane = run_alone(engine, args.strategy, req, on_step=show)
    if lane.error:
        raise SystemExit(f"error: {lane.error}")
    f = lane.figures()
    result = {"strategy": args.strategy, "text": lane.text, "token_ids": lane.token_ids,
              "forward_passes": f.forward_passes, "draft_passes": f.draft_passes, "ttft_s": f.ttft_s,
              "e2e_s": f.elapsed_s, "tokens_per_s": f.tokens_per_s, "tokens_per_pass": f.tokens_per_pass,
              "tokens": f.tokens, "tpot_s": f.tpot_s, "accepted": f.accepted, "drafted": f.drafted,
              "finish_reason": lane.finish_reason, "model": engine.name, "device": str(engine.device)}
    if args.json:
        print(json.dumps(result))
    else:
        def fmt(v, unit=""):
            return "-" if v is None else (f"{v:.3f}{unit}" if isinstance(v, float) else f"{v}{unit}")
        print(f"\n\n[{args.strategy}] {f.tokens} tokens, {f.forward_passes} forward passes, "
              f"{f.draft_passes} draft passes | TTFT {fmt(f.ttft_s, ' s')} | E2E {fmt(f.elapsed_s, ' s')} | "
              f"{fmt(f.tokens_per_s, ' tok/s')} | TPOT {fmt(f.tpot_s, ' s')} | "
              f"tokens/pass {fmt(f.tokens_per_pass)} | finish: {lane.finish_reason}", file=sys.stderr)
    return 0


def _roofline_probe(args, engine) -> dict | None:
    """The read-bandwidth probe a bench run takes once at its start (none with --no-roofline or a remote engine)."""
    if getattr(args, "no_roofline", False) or getattr(engine, "remote", False):
        return None
    from .roofline import probe
    rf = probe(engine)
    print(f"read bandwidth {rf['bandwidth_gbs']:.1f} GB/s on {engine.device} ({rf['threads']} threads, "
          f"{rf['probe_bytes'] / 2**30:.2f} GiB buffer); weights read per token "
          f"{rf['weight_bytes_per_token'] / 1e6:.1f} MB", file=sys.stderr)
    return rf


def _roofline(args) -> int:
    from .roofline import main
    return main(args)


def _bench(args) -> int:
    import os
    import json
    import platform
    from datetime import datetime, timezone

    from tqdm import tqdm

    from . import bench as B
    from .evalsets import EvalSetError, load_eval_set, load_suite
    from .store import Store, StoreError
    from .strategies import RequestError
    try:
        store = Store(args.db)            # a bad --db fails before the model loads, in one line
    except StoreError as e:
        raise RequestError(str(e)) from None
    params = None
    if not args.resume:
        try:
            params = json.loads(args.params or "{}")
        except ValueError as e:
            raise RequestError(f"--params is not valid JSON ({e}); expected e.g. "
                               '\'{"pld": {"max_ngram": 3}}\'') from None
    if args.resume:
        run = store.get_run(args.resume)
        if run is None:
            raise RequestError(f"there is no run {args.resume} in {store.url}")
        try:
            settings, items = B.resume_plan(store, run)
            store.resume_run(args.resume)     # claimed before the model loads; refused while another runs it
        except (B.ResumeError, StoreError) as e:
            raise RequestError(str(e)) from None
    engine = load_engine(args)
    if args.resume:
        if "roofline" not in (run["environment"] or {}):
            rf = _roofline_probe(args, engine)
            if rf:
                store.update_run(args.resume, environment={**(run["environment"] or {}), "roofline": rf})
        run_id = args.resume
    else:
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
        from .strategies import get, load_all
        registry, peers = load_all(), {}
        for spec in args.peer:
            try:
                name, strat, url = B.parse_peer(spec)
            except B.PeerError as e:
                raise RequestError(str(e)) from None
            if name in registry or name in peers:
                raise RequestError(f"--peer {spec!r}: the lane name {name!r} is taken; pick another")
            peers[name] = f"{strat}@{url}"
        strategies += [n for n in peers if n not in strategies]
        for s in strategies:
            if not getattr(engine, "remote", False) and s not in peers:
                get(s)   # unknown names fail before anything is stored
        if not getattr(engine, "remote", False):
            B.check_params([s for s in strategies if s not in peers], params)   # so do unknown or impossible parameters
        try:
            if args.suite:
                es = load_suite(args.suite)
            elif args.eval_set:
                local = not getattr(engine, "remote", False)
                es = load_eval_set(args.eval_set,
                                   max_prompt_tokens=engine.context_length - args.max_new_tokens if local else None,
                                   count_tokens=(lambda t: len(engine.tokenizer(t)["input_ids"])) if local else None)
            else:
                raise SystemExit("error: give --suite NAME or --eval-set FILE (or --resume RUN_ID)")
        except (EvalSetError, KeyError, FileNotFoundError) as e:
            raise SystemExit(f"error: {e}")
        if args.per_category:
            seen: dict = {}
            es.items = [it for it in es.items if seen.setdefault(it.category, []).append(it) or
                        len(seen[it.category]) <= args.per_category]
        settings = B.BenchSettings(strategies=strategies, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
                                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                   ignore_eos=args.ignore_eos, params=params, peers=peers,
                                   max_context=args.max_context,
                                   perplexity=not args.no_perplexity and not getattr(engine, "remote", False))
        set_id = store.save_eval_set(es, name=es.name)
        env = B.environment(engine, settings, _roofline_probe(args, engine))
        run_id = store.create_run("bench", name=args.name or es.name, model=engine.name, device=str(engine.device),
                                  dtype=env["dtype"], environment=env, strategies=B._ordered(strategies),
                                  settings={"bench": B.asdict(settings), "limit": args.limit}, eval_set_id=set_id)
        items = B.items_from_store(store, set_id)[: args.limit or None]
    print(f"run {run_id} in {store.url}: {len(items)} prompts x {len(settings.strategies)} strategies x "
          f"{settings.repeats} repeats", file=sys.stderr)
    bar = tqdm(total=len(items) * len(B._ordered(settings.strategies)) * settings.repeats, desc="bench",
               file=sys.stderr)

    def progress(done, total, label):
        bar.n = done
        bar.set_postfix_str(label[:40])
        bar.refresh()

    try:
        res = B.run_bench(engine, store, run_id, items, settings, progress=progress, resume=bool(args.resume))
    except KeyboardInterrupt:
        store.finish_run(run_id, "interrupted")
        raise SystemExit(f"interrupted; finish it with: python -m paradec bench --resume {run_id}")
    bar.close()
    store.finish_run(run_id, "finished")
    df = store.results_dataframe([run_id])
    rows = B.table(df)
    roof = B.roofline_summary(store.get_run(run_id)["environment"].get("roofline"), df, engine, items)
    mism = B.mismatch_lines(df)
    if args.json:
        print(json.dumps({"run": run_id, **res, "table": rows, "roofline": roof}))
    else:
        print(B.markdown(rows))
        if roof:
            print(B.roofline_line(roof))
        if mism:
            print(mism)
    if args.markdown:
        from .engine import cpu_name
        env = store.get_run(run_id)["environment"]
        cmd = "python -m paradec " + " ".join(sys.argv[1:]) if sys.argv[0].endswith(("paradec", "__main__.py")) \
            else "python -m paradec bench ..."
        head = (f"### {args.name or 'bench'} — run {run_id}\n\n"
                f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}\n"
                f"- machine: {cpu_name()}, {os.cpu_count()} cores, {env.get('device')}, "
                f"{env.get('dtype')}, torch {env.get('torch')}, transformers {env.get('transformers')}\n"
                f"- model: {env.get('model')} ({env.get('parameters', 0) / 1e6:.1f}M parameters)\n"
                f"- command: `{cmd}`\n"
                f"- settings: max_new_tokens {settings.max_new_tokens}, temperature {settings.temperature}, "
                f"repeats {settings.repeats}, prompts {len(items)}\n"
                + (f"- roofline: {B.roofline_line(roof)}\n" if roof else ""))
        Path(args.markdown).write_text(B.markdown(rows, head) + (f"\n{mism}" if mism else ""))
        print(f"wrote {args.markdown}", file=sys.stderr)
    return 0


def split_params(req, strategies: list[str]):
    """(request without parameters, {strategy: the --param keys it declares}) for a race: `--param k=6` goes to
    the lanes whose strategy has a `k` (`ar` has none, and refuses unknown parameters like every strategy); a key
    that no lane's strategy declares is an error. A strategy paradec does not know (one a remote server runs)
    gets every key."""
    from dataclasses import replace

    from .strategies import REGISTRY, load_all
    if not req.params:
        return req, {}
    load_all()
    known = {s: set(REGISTRY[s].params) if s in REGISTRY else set(req.params) for s in strategies}
    stray = [k for k in req.params if not any(k in ks for ks in known.values())]
    if stray:
        raise SystemExit(f"error: --param {stray[0]}: none of {', '.join(strategies)} has this parameter "
                         f"(`python -m paradec strategies` lists each one's)")
    return replace(req, params={}), {s: {k: v for k, v in req.params.items() if k in known[s]} for s in strategies}


def _race(args) -> int:
    import json

    from .bench import race_vs_alone
    from .race import Race
    from .strategies import length_check_engine
    engine = load_engine(args)
    req = make_request(args, args.prompt)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    req.validate(length_check_engine(engine, strategies))
    req, per_lane = split_params(req, strategies)
    if args.check:
        rows = race_vs_alone(engine, req, strategies, args.repeats, per_lane)
        print(json.dumps(rows) if args.json else "\n".join(
            f"{r['strategy']:12s} race {r['race_tokens_per_s']:8.1f} tok/s  alone {r['alone_tokens_per_s']:8.1f} "
            f"tok/s  race/alone {r['ratio']:.3f}  (n={r['n']})" for r in rows))
        return 0
    race = Race(engine, req, strategies, per_lane)
    race.run()
    snap = race.snapshot()
    if args.json:
        print(json.dumps({k: {kk: v for kk, v in d.items() if kk not in ("groups", "itl")} for k, d in snap.items()}))
        return 0
    for name, d in snap.items():
        print(f"== {name} [{d['status']}] {d['tokens']} tokens, {d['tokens_per_s'] or 0:.1f} tok/s, "
              f"tokens/pass {d['tokens_per_pass'] or 0:.2f}, speed-up {d['speedup'] or 1:.2f}x, "
              f"{'identical to ar' if d['diverges_at'] is None else 'diverges at ' + str(d['diverges_at'])}")
        print(d["text"])
    return 0


def _strategies(args) -> int:
    from .strategies import REGISTRY, load_all
    load_all()
    engine = load_engine(args) if not args.no_model else None
    for name in sorted(REGISTRY):
        s = REGISTRY[name]()
        ok, why = s.available(engine) if engine is not None else (True, "")
        flag = "available" if ok else f"unavailable: {why}"
        print(f"{name:14s} {'lossless' if s.lossless else 'lossy   '}  {s.title}  [{flag}]")
        for k, p in s.params.items():
            print(f"{'':16s}--param {k}={p.default!r}  {p.help}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paradec", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("model", help="provision the default model (`model setup`), print its folder (`model path`), "
                                 "measure it (`model measure`)", add_help=False)
    t = sub.add_parser("train", help="train the default model, its draft, the SoT router; `train ptp|lud|focus|eagle --help` "
                                     "for the PTP, LUD and FocusLLM parameters")
    t.add_argument("what", choices=["default", "draft", "smoke", "router", "card"])
    t.add_argument("--steps", type=int)
    t.add_argument("--name")
    t.add_argument("--out", help="output model folder (default data/models/NAME)")
    t.add_argument("--work", help="checkpoint folder (default data/work/NAME)")
    t.add_argument("--tokenizer-from", help="reuse this model folder's tokenizer")
    t.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    t.set_defaults(func=_train)

    g = sub.add_parser("generate", help="generate with one strategy, streaming, then a metrics summary")
    g.add_argument("--strategy", default="ar")
    g.add_argument("--prompt", required=True)
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    _model_args(g)
    _gen_args(g)
    g.set_defaults(func=_generate)

    r = sub.add_parser("race", help="race strategies on one prompt; --check compares race and alone figures")
    r.add_argument("--strategies", default="ar,pld,lookahead")
    r.add_argument("--prompt", required=True)
    r.add_argument("--check", action="store_true", help="race vs alone, tokens/s, --repeats times")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--json", action="store_true")
    _model_args(r)
    _gen_args(r)
    r.set_defaults(func=_race)

    b = sub.add_parser("bench", help="benchmark strategies over a suite or an eval set, stored in the database")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--suite", help="built-in suite name (evals/suites/NAME.jsonl)")
    src.add_argument("--eval-set", help="CSV or JSONL file (Spec-Bench question files too)")
    src.add_argument("--resume", type=int, metavar="RUN_ID", help="finish an interrupted run")
    b.add_argument("--strategies", default="ar,hf-generate", help="comma-separated; ar is always included")
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--limit", type=int, help="only the first N prompts")
    b.add_argument("--per-category", type=int, help="only the first N prompts of each category")
    b.add_argument("--params", help='JSON: {"strategy": {"param": value}}')
    b.add_argument("--peer", action="append", default=[], metavar="NAME=STRATEGY@URL",
                   help="a lane served by another engine, in the same run on the same prompts (repeatable), e.g. "
                        "vllm=ar@http://127.0.0.1:8011, vllm-ngram=vllm-spec@http://127.0.0.1:8012; timed client-side")
    b.add_argument("--db", help="SQLAlchemy URL or SQLite file (default $PARADEC_DB or data/paradec.db)")
    b.add_argument("--name", help="run name")
    b.add_argument("--json", action="store_true")
    b.add_argument("--markdown", help="write the results table (the BENCHMARKS.md form) to this file")
    b.add_argument("--no-perplexity", action="store_true", help="skip the perplexity pass per result")
    b.add_argument("--no-roofline", action="store_true", help="skip the memory-read bandwidth probe at the start "
                   "(and the line comparing ar with the read-bandwidth roofline)")
    _model_args(b)
    _gen_args(b)
    b.set_defaults(func=_bench, max_new_tokens=96)

    rl = sub.add_parser("roofline", help="measure the memory-read bandwidth and the batch-1 decoding roofline")
    rl.add_argument("--context", type=int, default=128, help="context length for the KV-cache reads")
    _model_args(rl)
    rl.set_defaults(func=_roofline)

    from .server import add_serve_parser
    add_serve_parser(sub)

    st = sub.add_parser("strategies", help="list strategies and their availability for the model")
    _model_args(st)
    st.add_argument("--no-model", action="store_true", help="list without loading a model")
    st.set_defaults(func=_strategies)
    return p


def main(argv=None) -> int:
    import httpx
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["model"]:               # provisioning owns its command line
        from .provision import main as model_main
        return model_main(argv[1:])
    if argv[:2] == ["train", "ptp"]:        # the PTP and LUD trainers own their command lines
        from .training.ptp_train import train_ptp_main
        return train_ptp_main(argv[2:])
    if argv[:2] == ["train", "draft"] and any(a == "--model" or a.startswith("--model=") for a in argv[2:]):
        from .training.draft_distill import main as draft_main   # a distilled draft for a given target
        return draft_main(argv[2:])
    if argv[:2] == ["train", "eagle"]:      # a feature-level (EAGLE) draft for a given target
        from .training.eagle_train import main as eagle_main
        return eagle_main(argv[2:])
    if argv[:2] == ["train", "lud"]:
        from .training.lud_train import train_lud_main
        return train_lud_main(argv[2:])
    if argv[:2] == ["train", "focus"]:
        from .training.focus_train import train_focus_main
        return train_focus_main(argv[2:])

    from .engine import ModelError
    from .remote import RemoteError
    from .store import StoreError
    from .strategies import RequestError
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ModelError, RequestError, RemoteError, StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except httpx.HTTPError as e:
        print(f"error: the engine at {getattr(args, 'engine', '?')} could not be reached: {e}", file=sys.stderr)
        return 2
