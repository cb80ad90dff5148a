"""`python -m paradec model measure`: the figures on the default model's card, measured on this machine.

* Perplexity on a held-out text, against paradec-tiny: the source of `difflib` from this machine's standard
  library (paradec-tiny's training held that module out; Qwen has surely seen public Python source, so for Qwen it
  is "text it did not see in this form", not a clean held-out set). The two models have different tokenizers, so
  per-token perplexities are not comparable: the comparable figure is bits per byte (total NLL / bytes / ln 2).
  Text is scored in non-overlapping windows of each model's `window` tokens (paradec-tiny's context is 512).
* Decoding speed: `ar`, greedy, on three chat prompts, 64 new tokens each (tokens/s, TPOT), in the engine's dtype.

The figures go to evals/model_figures.json (committed, with machine and date) and into the provisioned card.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import platform
from pathlib import Path

import torch

SPEED_PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
                 "Explain what a Python generator is, in a short paragraph.",
                 "Give three tips for naming variables well."]


def held_out_text(chars: int = 12_000) -> str:
    import difflib
    return Path(difflib.__file__).read_text()[:chars]


@torch.inference_mode()
def bits_per_byte(engine, text: str, window: int) -> dict:
    ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    nll, n = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window + 1]
        if len(chunk) < 2:
            break
        logits = engine.forward(chunk[:-1])[0]
        lp = torch.log_softmax(logits.float(), -1)
        tgt = torch.tensor(chunk[1:])
        nll -= float(lp[torch.arange(len(tgt)), tgt].sum())
        n += len(tgt)
    covered = engine.decode(ids[1:n + 1])
    nbytes = len(covered.encode())
    return {"tokens": n, "perplexity": round(math.exp(nll / n), 3), "bits_per_byte": round(nll / nbytes / math.log(2), 4)}


def speed(engine, max_new_tokens: int = 64) -> dict:
    from .race import run_alone
    from .strategies import Request
    rates, tpots = [], []
    run_alone(engine, "ar", Request(prompt="Hello", max_new_tokens=4))      # warm-up
    for p in SPEED_PROMPTS:
        lane = run_alone(engine, "ar", Request(prompt=p, max_new_tokens=max_new_tokens, ignore_eos=True))
        if lane.error:
            raise RuntimeError(lane.error)
        f = lane.figures()
        rates.append(f.tokens_per_s)
        tpots.append(f.tpot_s)
    return {"ar_tokens_per_s": round(sum(rates) / len(rates), 2), "ar_tpot_ms": round(1000 * sorted(tpots)[1], 1)}


def measure(dtype: str = "auto") -> dict:
    from . import provision
    from .engine import Engine
    from .roofline import read_bandwidth
    text = held_out_text()
    qwen = Engine.load(None, dtype=dtype)
    q = bits_per_byte(qwen, text, window=1024)
    s = speed(qwen)
    tiny = Engine.load("paradec-tiny", dtype="float32")
    t = bits_per_byte(tiny, text, window=512)
    del tiny
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    figures = {
        "measured": f"{dt.date.today().isoformat()}, {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "held-out text": f"difflib.py source, first {len(text):,} characters (Python {platform.python_version()})",
        "bits per byte (lower is better)": f"{q['bits_per_byte']} (perplexity {q['perplexity']} over {q['tokens']} "
                                           f"tokens) vs paradec-tiny {t['bits_per_byte']} (perplexity "
                                           f"{t['perplexity']} over {t['tokens']} of its tokens)",
        "ar decoding": f"{s['ar_tokens_per_s']} tokens/s, TPOT p50 {s['ar_tpot_ms']} ms, dtype "
                       f"{str(qwen.dtype).replace('torch.', '')}, batch 1, 64 new tokens, 3 chat prompts",
        "memory-read bandwidth": f"{read_bandwidth(qwen.device):.1f} GB/s",
    }
    provision.FIGURES.write_text(json.dumps(figures, indent=1) + "\n")
    card = provision.default_dir() / "README.md"
    info = json.loads((provision.default_dir() / provision.MARKER).read_text())
    card.write_text(provision.card_text(info, figures))
    return figures
