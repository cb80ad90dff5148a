"""The autoregressive baseline: on the real default model (Qwen2.5-Coder-0.5B-Instruct) equal to transformers'
generate token for token on varied prompts, stopping at the chat turn's end; seeded sampling and the sampled
distribution on paradec-tiny (hundreds of calls)."""
import math
from collections import Counter

import pytest
import torch

from paradec import sampling
from paradec.strategies import Request, get

# varied on purpose: code, explanation, translation, arithmetic, a list, an edit, raw completions
PROMPTS = [
    ("Write a Python function that checks whether a string is a palindrome.", True),
    ("Explain in two sentences what a context manager is in Python.", True),
    ("Translate into French: The library is closed on Sundays.", True),
    ("A train travels 120 km in 1.5 hours. What is its average speed? Answer briefly.", True),
    ("Give three tips for writing good commit messages.", True),
    ("Rename the variable x to total in this code:\nx = 0\nfor v in values:\n    x += v\nprint(x)", True),
    ("def read_lines(path):\n    \"\"\"Return the lines of a text file.\"\"\"\n", False),
    ("import sys\n\n\ndef main(argv):\n", False),
]
TINY_PROMPTS = [
    ("What does `json.dumps` do?", True),
    ("Outline the module `string`.", True),
    ("What does `os.path.join` do?", True),
    ("Outline the module `shutil`.", True),
    ("def read_lines(path):\n    \"\"\"Return the lines of a text file.\"\"\"\n", False),
    ("import sys\n\n\ndef main(argv):\n", False),
    ("class Stack:\n    def __init__(self):\n", False),
    ("Explain what a context manager is.", True),
]


def ids_of(engine, name, req):
    return [t for s in get(name).stream(engine, req) for t in s.token_ids]


def assert_ar_equals_generate(e, prompts, n):
    """Greedy `ar` gives transformers' own generate's token ids, n tokens (EOS ignored), for every prompt."""
    for prompt, chat in prompts:
        req = Request(prompt=prompt, chat=chat, max_new_tokens=n, ignore_eos=True)
        ours = ids_of(e, "ar", req)
        x = torch.tensor([e.encode(req)])
        with torch.inference_mode():
            ref = e.model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                                   max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=e.pad_id)
        assert ours == ref[0, x.shape[1]:].tolist(), prompt


def test_greedy_ar_equals_transformers_generate(default_engine):
    assert default_engine.name == "qwen2.5-coder-0.5b-instruct" and default_engine.vocab_size == 151936
    assert_ar_equals_generate(default_engine, PROMPTS, 32)


def test_greedy_ar_equals_generate_on_paradec_tiny(tiny_model_engine):
    assert_ar_equals_generate(tiny_model_engine, TINY_PROMPTS, 48)


def test_default_model_stops_at_the_end_of_its_turn(default_engine):
    """`<|im_end|>` ends the chat turn: ar and hf-generate stop there, with the same tokens, and say eos."""
    e = default_engine
    im_end = e.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in e.eos_ids and e.tokenizer.convert_tokens_to_ids("<|endoftext|>") in e.eos_ids
    req = Request(prompt="Reply with one word: what colour is a clear daytime sky?", max_new_tokens=24)
    steps = list(get("ar").stream(e, req))
    ids = [t for s in steps for t in s.token_ids]
    assert steps[-1].finish_reason == "eos" and 1 <= len(ids) < 24 and im_end not in ids
    assert "blue" in "".join(s.text for s in steps).lower()
    assert ids_of(e, "hf-generate", req) == ids


def test_eos_stops_and_text_matches_ids(tiny_model_engine):
    e = tiny_model_engine
    req = Request(prompt="What does `json.dumps` do?", max_new_tokens=200)
    steps = list(get("ar").stream(e, req))
    ids = [t for s in steps for t in s.token_ids]
    assert steps[-1].finished and steps[-1].finish_reason in ("eos", "length")
    assert not set(ids) & e.eos_ids
    assert "".join(s.text for s in steps) == e.decode(ids)
    assert sum(s.forward_passes for s in steps) == len(ids) + (1 if steps[-1].finish_reason == "eos" else 0)


def test_stop_string(tiny_model_engine):
    req = Request(prompt="Outline the module `string`.", max_new_tokens=80, stop=["\n"])
    text = "".join(s.text for s in get("ar").stream(tiny_model_engine, req))
    assert "\n" not in text


def test_seeded_sampling_reproducible(tiny_model_engine):
    req = Request(prompt="Outline the module `os`.", max_new_tokens=30, temperature=0.9, top_p=0.95, seed=11)
    a, b = ids_of(tiny_model_engine, "ar", req), ids_of(tiny_model_engine, "ar", req)
    c = ids_of(tiny_model_engine, "ar", Request(**{**req.__dict__, "seed": 12}))
    assert a == b and a != c


def test_sampling_follows_processed_distribution(tiny_model_engine):
    """First token over many seeds against the exact processed probabilities (chi-square, 5 bins + rest)."""
    e = tiny_model_engine
    sp = sampling.SamplingParams(temperature=1.0, top_k=6)
    base = Request(prompt="def ", chat=False, max_new_tokens=1, temperature=1.0, top_k=6, ignore_eos=True)
    probs = sampling.process(e.forward(e.encode(base), e.new_cache())[0, -1], sp)
    n = 600
    counts = Counter(ids_of(e, "ar", Request(**{**base.__dict__, "seed": s}))[0] for s in range(n))
    support = torch.nonzero(probs).flatten().tolist()
    assert set(counts) <= set(support)
    chi2 = sum((counts.get(t, 0) - n * probs[t].item()) ** 2 / (n * probs[t].item()) for t in support)
    # 5 degrees of freedom: P(chi2 > 20.5) ~ 0.001
    assert chi2 < 20.5, (chi2, counts, {t: round(probs[t].item(), 3) for t in support})
    assert not math.isnan(chi2)


@pytest.mark.slow
def test_cli_reaches_the_default_model_offline():
    import json
    import os
    import subprocess
    import sys

    from conftest import ROOT
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": "/nonexistent-hf-home"}
    p = subprocess.run([sys.executable, "-m", "paradec", "generate", "--prompt", "What does `json.dumps` do?",
                        "--max-new-tokens", "12", "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["model"] == "qwen2.5-coder-0.5b-instruct" and 1 <= out["tokens"] <= 12 and out["tokens_per_pass"] <= 1.0
    for key in ("text", "token_ids", "forward_passes", "draft_passes", "ttft_s", "e2e_s", "tokens_per_s"):
        assert key in out


def test_shipped_models_have_cards_and_figures():
    import json

    from conftest import DRAFT, TINY as DEFAULT
    for d in (DEFAULT, DRAFT):
        s = json.loads((d / "training_summary.json").read_text())
        card = (d / "README.md").read_text()
        assert f"{s['parameters']:,}" in card and "validation perplexity" in card and "python -m paradec train" in card
        assert (d / "model.safetensors").exists() and (d / "tokenizer.json").exists()
    s = json.loads((DEFAULT / "training_summary.json").read_text())
    d = json.loads((DRAFT / "training_summary.json").read_text())
    assert 10e6 <= s["parameters"] <= 30e6 and d["parameters"] < s["parameters"] / 5
    assert s["arch"]["max_position_embeddings"] >= 512 and 7000 <= s["vocab_size"] <= 9000
    assert "format_rates" in s


def test_the_shared_argmax_is_torchs_argmax_ties_included():
    """sampling.argmax (through max, faster on bf16 rows) picks the first largest logit, as argmax does."""
    from paradec.sampling import argmax
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.bfloat16, torch.float32):
        for rows in (1, 3):
            x = (torch.randn(rows, 5000, generator=g) * 2).round().to(dtype)   # many ties
            x[:, 4000] = x[:, 17] = 50                                          # a tie at the top, far apart
            assert argmax(x).tolist() == x.argmax(-1).tolist() == [17] * rows
            y = torch.randn(rows, 5000, generator=g).to(dtype)
            assert torch.equal(argmax(y), y.argmax(-1)) and torch.equal(argmax(y[0]), y[0].argmax())
