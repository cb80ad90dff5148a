"""One prepared GPU check (about 4 minutes on an H200). Not a test: CI has no GPU, and no test depends on one.

    python evals/gpu_check.py [--tokens 256] [--md docs/bench/gpu-check.md] [--json FILE] [--skip-tests]
    python evals/gpu_check.py --small --device cpu      # the same steps on tiny shapes: a dry run of the script

The default model cannot travel to the GPU machine (the lease carries 64 MiB), so its timings use randomly
initialised models of real shapes, in bfloat16: Qwen2.5-Coder-0.5B-Instruct's (the default model: 24 layers,
hidden 896, 14 query / 2 key-value heads, untied 151,936-entry head) and Llama-3-8B's. Random weights give real
costs but not real acceptance: the tokens/pass of a drafting strategy on them says nothing about a trained model.

1. the device's copy bandwidth (bytes read per second of a large device-to-device copy);
2. per shape: the cost of one forward pass over 1..64 new tokens after a 200-token cached context, through
   paradec's row-exact attention and through SDPA (the regime in which verifying drafts is nearly free);
   `ar` at batch 1 (EOS ignored) against transformers' `generate` in the same process, and `ar`'s share of the
   read-bandwidth roofline (weight bytes x tokens/s / bandwidth);
   the lossless strategies (pld, lookahead) against `ar` token for token on the GPU in bfloat16;
   each with paradec's row-exact plan for CUDA (paradec/kernels.py `fixed_rows`, float64 attention scores) and,
   in the same run, without it (the rows probe, the pass costs, `ar`'s speed and the token-for-token runs), so the
   plan's effect and cost are measured side by side;
3. last, the tests of the strategies with the random test engines on the GPU (`PARADEC_TEST_DEVICE=cuda`; the
   slow ones, which need the default model, left out): device placement and token-for-token equality there.

It prints a Markdown section (also written to --md) and the figures as JSON (--json).

On this workplace's lent H200 (2026-12-04): the repository's tracked files are ~219 MB, over the 64 MiB a call
carries, so the large weights (the shipped adapters, drafts, paradec-tiny's weights, the reference database) were
left out for the calls (`git rm --cached` them, list them in .git/info/exclude, `git reset` them afterwards; the
tests that need them skip or fail by name), and transformers 5.23 travelled as a wheel (the image has 5.17). The
whole check took 212 s of a 230 s call; `--parts tests` alone about 70 s. The second check (with and without the
row-exact plan) took 267 s of a 278 s call, the machine's start about 40 s more.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evals.forward_cost import curve  # noqa: E402

LOSSLESS_TESTS = ["tests/test_ar.py", "tests/test_speculative.py", "tests/test_engine.py", "tests/test_ptp.py",
                  "tests/test_lud.py", "tests/test_draft.py"]
PROMPTS = ["def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
           "def fibonacci(n):",
           "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the quick",
           "SELECT name, price FROM items WHERE price > 10 ORDER BY price; SELECT name, price FROM items WHERE"]


def shapes(small: bool) -> list[tuple[str, object]]:
    from transformers import LlamaConfig, Qwen2Config
    if small:
        return [("qwen2-tiny", Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           max_position_embeddings=4096, tie_word_embeddings=False)),
                ("llama-tiny", LlamaConfig(vocab_size=128256, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           max_position_embeddings=4096))]
    return [("qwen2.5-0.5b-shape", Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                               num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                               max_position_embeddings=32768, rope_theta=1000000.0,
                                               tie_word_embeddings=False)),
            ("llama-3-8b-shape", LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                             num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                             max_position_embeddings=8192, rope_theta=500000.0))]


def run_tests(device: str, timeout: int, log: str | None = None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PARADEC_TEST_DEVICE": device}
    t0 = time.time()
    try:
        import importlib.util
        par = ["-n", "6"] if importlib.util.find_spec("xdist") else []     # pytest-xdist, where it is installed
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *par,
                            *LOSSLESS_TESTS], cwd=ROOT, env=env, timeout=timeout, capture_output=True, text=True)
        out = p.stdout + p.stderr
        rc = f"exit {p.returncode}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out, rc = out + f"\n(timed out after {timeout} s)", f"timed out after {timeout} s"
    print(out[-6000:], flush=True)
    if log:
        Path(log).write_text(out)
    summary = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    failed = sorted({m.group(1) for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)", out, re.M)})
    return {"rc": rc, "summary": summary[-1].strip("= ") if summary else f"no summary ({rc})", "failed": failed,
            "seconds": round(time.time() - t0, 1)}


def copy_bandwidth(device: torch.device, gib: float) -> float:
    """Bytes read per second by a device-to-device copy of `gib` GiB (best of 5): the read roofline's bandwidth."""
    n = int(gib * (1 << 30)) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device=device).fill_(1)
    b = torch.empty_like(a)
    best = None
    for _ in range(6):
        sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        sync(device)
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    del a, b
    return 2 * n / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(cfg, device: torch.device, tok):
    from transformers import AutoModelForCausalLM

    from paradec.engine import Engine
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    finally:
        torch.set_default_dtype(old)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, Engine(model, tok, name=f"random {cfg.model_type}")


def check_shape(label: str, cfg, device: torch.device, tok, tokens: int, bandwidth: float, small: bool,
                parts: str = "shapes", probe_repeats: int = 4) -> dict:
    from paradec import attention
    from paradec.race import run_alone
    from paradec.strategies import Request
    t0 = time.time()
    model, engine = build(cfg, device, tok)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    res = {"shape": label, "params": sum(p.numel() for p in model.parameters()), "weight_gb": weight_bytes / 1e9,
           "attention": engine.attention}
    # 3a. pass costs after a 200-token context, row-exact attention then SDPA
    g = torch.Generator().manual_seed(0)
    news = [1, 4, 16, 64]
    costs = {}
    for impl in (engine.attention, "sdpa"):
        if impl == "sdpa":
            model.set_attn_implementation("sdpa")
        cache = engine.new_cache()
        ctx = torch.randint(0, 1000, (200,), generator=g).tolist()
        engine.forward(ctx, cache, logits_to_keep=1)
        curve(engine, cache, 200, [1, 4], 2, g)           # warm-up
        costs[impl] = {T: round(1000 * s, 2) for T, s in curve(engine, cache, 200, news, 10, g).items()}
        del cache
    attention.use(model)
    res["pass_ms"] = costs
    res["row_exact_plan"] = row_exact(model, True)
    res["rows_probe"] = rows_probe(engine, repeats=probe_repeats)
    print(label, "rows probe", res["rows_probe"], flush=True)
    if res["row_exact_plan"]:
        # the same probe without the plan (every product at its own row count, float32 attention scores): what
        # the plan changes, on this device, in this run
        row_exact(model, False)
        res["rows_probe_without_plan"] = rows_probe(engine, repeats=probe_repeats)
        res["pass_ms"]["without the row-exact plan"] = {
            T: round(1000 * s, 2) for T, s in curve(engine, _cached(engine, g), 200, news, 10, g).items()}
        row_exact(model, True)
        print(label, "rows probe without the plan", res["rows_probe_without_plan"], flush=True)
    if "shapes" not in parts:
        return res
    # 3b. ar against transformers' generate, EOS ignored
    req = Request(prompt="def main():", chat=False, max_new_tokens=tokens, ignore_eos=True)
    warm = Request(prompt="x", chat=False, max_new_tokens=8, ignore_eos=True)
    for s in ("ar", "hf-generate"):
        run_alone(engine, s, warm)
    speed = {}
    plan = res["row_exact_plan"]
    fast = engine.fast
    runs = [("ar", "ar"), ("hf-generate", "hf-generate"), ("ar", "ar")]
    if plan:
        runs.append(("ar", "ar without the plan"))
    if engine.fast:
        runs.append(("ar", "ar through transformers' forward"))   # paradec/fastpath.py's share
    for s, label_s in runs:
        if label_s.endswith("without the plan"):
            row_exact(model, False)
            run_alone(engine, s, warm)
        engine.fast = fast and not label_s.endswith("transformers' forward")
        lane = run_alone(engine, s, req)
        engine.fast = fast
        if label_s.endswith("without the plan"):
            row_exact(model, True)
        if lane.error:
            speed[label_s] = {"error": lane.error}
            continue
        f = lane.figures()
        speed.setdefault(label_s, {"tokens_per_s": [], "tpot_ms": [], "tokens": f.tokens})
        speed[label_s]["tokens_per_s"].append(round(f.tokens_per_s, 2))
        speed[label_s]["tpot_ms"].append(round(1000 * (f.tpot_s or 0), 2))
    res["speed"] = speed
    ar_tps = max(speed["ar"]["tokens_per_s"]) if "tokens_per_s" in speed.get("ar", {}) else None
    if ar_tps:
        res["roofline_tokens_per_s"] = round(bandwidth / weight_bytes, 1)
        res["ar_roofline_fraction"] = round(weight_bytes * ar_tps / bandwidth, 3)
        hf = speed.get("hf-generate", {}).get("tokens_per_s")
        res["ar_over_hf_generate"] = round(ar_tps / max(hf), 3) if hf else None
    # 4. lossless strategies against ar on the device, bf16
    n_tok = 32 if small else 128
    res["lossless"] = lossless_runs(engine, n_tok)
    if plan:
        row_exact(model, False)
        res["lossless_without_plan"] = lossless_runs(engine, n_tok)
        row_exact(model, True)
    res["seconds"] = round(time.time() - t0, 1)
    del engine, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def row_exact(model, on: bool) -> str | None:
    """Turn paradec's row-exact plan for CUDA on or off on `model` (paradec/kernels.py `fixed_rows`, float64
    attention scores: paradec/attention.py `scores_dtype`); returns its name when on. Never on off CUDA."""
    from paradec import attention, kernels
    global _SCORES
    _SCORES = _SCORES or attention.scores_dtype
    if on and kernels.fixed_rows_wanted(next(model.parameters()).device):
        kernels.fixed_rows(model)
        attention.scores_dtype = _SCORES
        return "fixed-rows products + float64 scores"
    kernels.unfix_rows(model)
    attention.scores_dtype = lambda device, dtype=None: torch.float32
    return None


_SCORES = None


def _cached(engine, g):
    cache = engine.new_cache()
    engine.forward(torch.randint(0, 1000, (200,), generator=g).tolist(), cache, logits_to_keep=1)
    return cache


def lossless_runs(engine, n_tok: int) -> dict:
    """pld and lookahead against ar, token for token, on PROMPTS."""
    from paradec.race import run_alone
    from paradec.strategies import Request
    lossless = {}
    for s in ("pld", "lookahead"):
        rows = []
        for prompt in PROMPTS:
            r = Request(prompt=prompt, chat=False, max_new_tokens=n_tok, ignore_eos=True)
            base, other = run_alone(engine, "ar", r), run_alone(engine, s, r)
            if other.error or base.error:
                rows.append({"error": other.error or base.error})
                continue
            a, b = base.token_ids, other.token_ids
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if first is None and len(a) != len(b):
                first = min(len(a), len(b))
            fa, fb = base.figures(), other.figures()
            rows.append({"same": first is None, "first_difference": first, "tokens": len(b),
                         "tokens_per_pass": round(fb.tokens_per_pass or 0, 2),
                         "speed_up": round(fb.tokens_per_s / fa.tokens_per_s, 2)})
        lossless[s] = rows
    return lossless


def rows_probe(engine, rows: int = 8, context: int = 200, repeats: int = 4) -> dict:
    """Whether a row of a many-row pass gets a one-token pass's logits on this device: `repeats` times, a
    random `context` is cached, then `rows` random tokens go through one pass and, after cropping, one token at a
    time. Reports the largest logit difference, how many rows' argmax agree, and the random model's median gap
    between its two best logits (how near a tie a difference must come to flip a token)."""
    g = torch.Generator().manual_seed(1)
    worst, agree, differ, gaps = 0.0, 0, 0, []
    for _ in range(repeats):
        ctx = torch.randint(0, 1000, (context,), generator=g).tolist()
        new = torch.randint(0, 1000, (rows,), generator=g).tolist()
        cache = engine.new_cache()
        engine.forward(ctx, cache, logits_to_keep=1)
        many = engine.forward(new, cache, positions=list(range(context, context + rows)), logits_to_keep=rows)[0]
        engine.crop(cache, context)
        ones = torch.cat([engine.forward([t], cache, positions=[context + i], logits_to_keep=1)[0]
                          for i, t in enumerate(new)])
        d = (many - ones).abs().amax(-1)
        worst = max(worst, float(d.max()))
        differ += int((d > 0).sum())
        agree += int((many.argmax(-1) == ones.argmax(-1)).sum())
        top2 = ones.topk(2, dim=-1).values
        gaps += (top2[:, 0] - top2[:, 1]).tolist()
        del cache
    gaps.sort()
    return {"pass_rows": rows, "rows": rows * repeats, "rows_differing": differ, "max_logit_difference": round(worst, 4),
            "argmax_agree": agree, "median_top2_gap": round(gaps[len(gaps) // 2], 4)}


def markdown(info: dict) -> str:
    L = [f"**Machine**: {info['device_name']}; torch {info['torch']}, transformers {info['transformers']}; "
         f"bfloat16, batch 1, random weights of real shapes. **Date**: {info['date']}. Command: "
         f"`python evals/gpu_check.py` ({info['seconds']:.0f} s).", ""]
    t = info.get("tests")
    if t:
        L += [f"- Tests of the lossless strategies with the random test engines on `{info['device']}` "
              f"(`PARADEC_TEST_DEVICE`, slow tests left out): **{t['summary']}** in {t['seconds']} s"
              + (f"; failed: {', '.join(t['failed'])}" if t["failed"] else "") + "."]
    L += [f"- Device-to-device copy: {info['bandwidth_gbs']:.0f} GB/s read (the roofline's bandwidth below).", ""]
    for r in info["shapes"]:
        if "error" in r:
            L += [f"**{r['shape']}**: failed: `{r['error'].strip().splitlines()[-1]}`", ""]
            continue
        L += [f"**{r['shape']}** ({r['params'] / 1e6:.0f}M parameters, {r['weight_gb']:.2f} GB of weights):", ""]
        news = list(next(iter(r["pass_ms"].values())))
        if isinstance(news[0], str):
            r["pass_ms"] = {k: {int(T): v for T, v in c.items()} for k, c in r["pass_ms"].items()}
            news = [int(T) for T in news]
        L += ["| pass over T new tokens, 200 cached | " + " | ".join(f"T={T}" for T in news) + " |",
              "|---|" + "---|" * len(news)]
        for impl, c in r["pass_ms"].items():
            plan = " + fixed-rows products" if r.get("row_exact_plan") and "without" not in impl else ""
            name = ("SDPA" if impl == "sdpa" else "row-exact attention, float32 scores, no fixed rows"
                    if "without" in impl else "row-exact attention") + plan
            L.append(f"| {name}, ms (× one token) | "
                     + " | ".join(f"{c[T]:.2f} ({c[T] / c[news[0]]:.2f}×)" for T in news) + " |")
        pr = r.get("rows_probe")
        if pr:
            L += ["", f"Rows of {pr['pass_rows']}-token passes against one-token passes (200 cached tokens, "
                      f"{pr['rows']} rows): {pr['rows_differing']} differ, by up to {pr['max_logit_difference']} in a logit; argmax the "
                      f"same in {pr['argmax_agree']} of {pr['rows']}; the random model's median gap between its two "
                      f"best logits {pr['median_top2_gap']}"
                      + (f" (with the row-exact plan: {r['row_exact_plan']})." if r.get("row_exact_plan") else ".")]
            nb = r.get("rows_probe_without_plan")
            if nb:
                L += ["", f"The same probe without the plan: {nb['rows_differing']} of {nb['rows']} rows differ, by "
                          f"up to {nb['max_logit_difference']}; argmax the same in {nb['argmax_agree']}."]
        if "speed" not in r:
            L.append("")
            continue
        sp = r["speed"]
        if "tokens_per_s" in sp.get("ar", {}):
            ar = sp["ar"]
            hf = sp.get("hf-generate", {})
            L += ["", f"`ar`, {ar['tokens']} tokens: {' / '.join(map(str, ar['tokens_per_s']))} tokens/s "
                      f"(TPOT {' / '.join(map(str, ar['tpot_ms']))} ms); transformers `generate`: "
                      f"{' / '.join(map(str, hf.get('tokens_per_s', ['error'])))} tokens/s; ar ÷ generate "
                      f"**{r.get('ar_over_hf_generate')}**; ar at **{100 * r['ar_roofline_fraction']:.1f}%** of "
                      f"the read roofline ({r['roofline_tokens_per_s']} tokens/s)."]
            wo = sp.get("ar without the plan", {}).get("tokens_per_s")
            if wo:
                L.append(f"`ar` without the row-exact plan: {' / '.join(map(str, wo))} tokens/s (the plan's cost).")
            tf = sp.get("ar through transformers' forward", {}).get("tokens_per_s")
            if tf:
                L.append(f"`ar` through transformers' own forward instead of paradec/fastpath.py: "
                         f"{' / '.join(map(str, tf))} tokens/s.")
        else:
            L += ["", f"`ar`: {sp.get('ar')}"]
        for key, how in (("lossless", ""), ("lossless_without_plan", " without the row-exact plan")):
            for s, rows in r.get(key, {}).items():
                same = sum(1 for x in rows if x.get("same"))
                L.append(f"`{s}` against `ar`{how}, token for token: **{same} of {len(rows)}** prompts identical "
                         f"(first differences at {[x.get('first_difference') for x in rows]}); tokens/pass "
                         f"{[x.get('tokens_per_pass') for x in rows]}, speed-up {[x.get('speed_up') for x in rows]} "
                         f"(random weights: acceptance is not a trained model's).")
        L.append("")
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny shapes: a dry run of the script (e.g. on the CPU)")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--test-timeout", type=int, default=200)
    ap.add_argument("--parts", default="shapes,tests", help="shapes (timings, rows probe, lossless runs), probe "
                                                            "(the rows probe alone), tests")
    ap.add_argument("--test-log", help="write the whole pytest output here")
    ap.add_argument("--probe-repeats", type=int, default=4, help="passes of the rows probe (8 rows each)")
    ap.add_argument("--shape", help="only the shapes whose label contains this (qwen, llama)")
    ap.add_argument("--md", help="write the Markdown section here")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers import AutoTokenizer

    from paradec.testing import tokenizer_dir
    t0 = time.time()
    device = torch.device(a.device)
    info = {"device": a.device, "torch": torch.__version__, "transformers": transformers.__version__,
            "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    info["bandwidth_gbs"] = copy_bandwidth(device, 0.0625 if a.small else 4.0) / 1e9
    print(f"copy bandwidth {info['bandwidth_gbs']:.0f} GB/s", flush=True)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    info["shapes"] = []
    for label, cfg in shapes(a.small) if {"shapes", "probe"} & set(a.parts.split(",")) else []:
        if a.shape and a.shape not in label:
            continue
        try:
            r = check_shape(label, cfg, device, tok, 32 if a.small else a.tokens, info["bandwidth_gbs"] * 1e9,
                            a.small, a.parts, a.probe_repeats)
        except Exception:  # noqa: BLE001 - one shape failing keeps the other's figures
            import traceback
            traceback.print_exc()
            r = {"shape": label, "error": traceback.format_exc(limit=3)}
        print(json.dumps(r), flush=True)
        info["shapes"].append(r)
        write(info, a, t0)
    if not a.skip_tests and "tests" in a.parts:       # last: the timings above are kept if the tests run out of time
        info["tests"] = run_tests(a.device, a.test_timeout, a.test_log)
    print(write(info, a, t0))
    return 0


def write(info: dict, a, t0: float) -> str:
    info["seconds"] = time.time() - t0
    md = markdown(info)
    if a.md:
        Path(a.md).write_text(md + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(info, indent=1))
    return md


if __name__ == "__main__":
    sys.exit(main())
