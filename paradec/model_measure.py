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


STORAGE_PROMPTS = [("Write a Python function that checks whether a string is a palindrome.", True),
                   ("Explain in two sentences what a context manager is in Python.", True),
                   ("Translate into French: The library is closed on Sundays.", True),
                   ("A train travels 120 km in 1.5 hours. What is its average speed? Answer briefly.", True),
                   ("Give three tips for writing good commit messages.", True),
                   ("def read_lines(path):\n    \"\"\"Return the lines of a text file.\"\"\"\n", False)]


def compare_storage(engine, max_new_tokens: int = 64) -> str:
    """Does storing the dequantized weights in bf16 (what setup writes) instead of fp32 change the outputs?
    The fp32 weights come straight from the GGUF; both are computed in fp32, greedy, on STORAGE_PROMPTS."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from . import provision
    from .engine import Engine
    from .strategies import Request, get
    with tempfile.TemporaryDirectory(dir=provision.MODELS) as tmp:
        gguf = Path(tmp) / "model.gguf"
        provision.assemble(provision.find_parts(), gguf)
        fp32 = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=gguf.name, dtype=torch.float32).eval()
    ref = Engine(fp32, engine.tokenizer, name="fp32-stored")
    b16 = dict(engine.model.named_parameters())
    rel = [float((v.detach() - b16[k].detach().float()).norm() / v.detach().norm()) for k, v in fp32.named_parameters()]
    same, firsts = 0, []
    for prompt, chat in STORAGE_PROMPTS:
        req = Request(prompt=prompt, chat=chat, max_new_tokens=max_new_tokens, ignore_eos=True)
        a = [t for s in get("ar").stream(engine, req) for t in s.token_ids]
        b = [t for s in get("ar").stream(ref, req) for t in s.token_ids]
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        same += d is None
        firsts.append(d)
    return (f"greedy outputs identical on {same} of {len(STORAGE_PROMPTS)} prompts x {max_new_tokens} tokens "
            f"(first differences {firsts}); weights differ by {100 * sum(rel) / len(rel):.2f}% relative L2 "
            "on average (both computed in fp32)")


def measure(dtype: str = "auto", storage: bool = True) -> dict:
    from . import provision
    from .engine import Engine
    from .roofline import read_bandwidth
    text = held_out_text()
    qwen = Engine.load(None, dtype=dtype)
    q = bits_per_byte(qwen, text, window=1024)
    s = speed(qwen)
    stored = compare_storage(Engine.load(None, dtype="float32")) if storage else None
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
    if stored:
        figures["bf16 storage vs fp32"] = stored
    provision.FIGURES.write_text(json.dumps(figures, indent=1) + "\n")
    card = provision.default_dir() / "README.md"
    info = json.loads((provision.default_dir() / provision.MARKER).read_text())
    card.write_text(provision.card_text(info, figures))
    return figures
