"""The training prompt set: chat requests of the kinds the benchmark suites hold, but none of their prompts.

Distilled drafters (the draft model, PTP, LUD) learn from the target's own answers to these prompts. They are
derived mechanically from the standard library (paradec.training.corpus), so they share no text with
evals/suites: every kind below is built from a module, a member and its docstring or source, plus small
word lists for the tasks that need no library text (arithmetic, conversation). Modules are split into train
and held-out by the corpus' stable hash, so held-out figures are on modules no drafter saw.

    kinds: explain, code, code-edit, summarize, translate, math, conversation, lists, qa-context

`training_prompts(n, seed, split)` -> list of {"kind", "messages"}; `overlap_with_suites(prompts)` is the check
the tests run (no 8-word window of any benchmark prompt appears in a training prompt).
"""
from __future__ import annotations

import ast
import functools
import json
import random
import re
from pathlib import Path

from . import corpus as C

KINDS = ("explain", "code", "code-edit", "summarize", "translate", "math", "conversation", "lists", "qa-context")
SUITES = Path(__file__).resolve().parents[2] / "evals" / "suites"

_EDITS = ("Add type hints to this function.", "Rewrite this function so it is easier to read; keep its behaviour.",
          "Add a docstring to this function in Google style.", "Rename the local variables of this function to "
          "more descriptive names.", "Add input validation to this function that raises ValueError on bad "
          "arguments.", "Convert this function to use early returns where it helps.")
_LANGS = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch")
_TOPICS = ("keeping a small team's code reviews fast", "learning a second programming language",
           "planning a week of healthy meals", "preparing for a job interview as a developer",
           "organising files on a shared drive", "writing clear commit messages", "taking notes in meetings",
           "starting to run as an adult beginner", "reducing screen time in the evening",
           "mentoring a junior engineer", "choosing a laptop for data analysis", "keeping houseplants alive",
           "saving money on groceries", "debugging a program that only fails sometimes",
           "writing a good bug report", "running an effective retrospective", "making a budget spreadsheet",
           "learning to touch type", "designing a small REST API", "naming variables well")
_ITEMS = ("notebooks", "apples", "tickets", "cables", "chairs", "lamps", "books", "mugs", "bottles", "plants")
_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun")


@functools.lru_cache(maxsize=1)
def _modules():
    corp = C.build_corpus()
    return corp.train_modules, corp.val_modules


def _functions(mod: C.Module, max_lines: int = 24) -> list[str]:
    """Source of the module's short top-level functions (4..max_lines lines), docstrings removed."""
    try:
        tree = ast.parse(mod.source)
    except SyntaxError:
        return []
    out = []
    lines = mod.source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.end_lineno and 4 <= node.end_lineno - node.lineno < max_lines:
            body = lines[node.lineno - 1:node.end_lineno]
            text = "\n".join(body)
            doc = ast.get_docstring(node, clean=False)
            if doc and len(doc) < 400:
                text = re.sub(r'\n\s+(\"\"\"|\'\'\')[\s\S]*?\1', "", text, count=1)
            out.append(text)
    return out


def _one(kind: str, mod: C.Module, rng: random.Random) -> str | None:
    members = mod.members
    short = mod.name.split(".")[-1]
    if kind == "explain" and members:
        q, sig, _doc = rng.choice(members)
        return rng.choice((f"Explain what `{q}` does and when I would use it.",
                           f"How do I use `{sig}` from the `{mod.name}` module? Give a short example.",
                           f"What are common mistakes when using `{q}`?"))
    if kind == "code" and members:
        q, sig, doc = rng.choice(members)
        task = C.sentences(C.first_paragraph(doc), 1).rstrip(".")
        return rng.choice((f"Write a short Python script that uses `{q}`. It should: {task.lower()}.",
                           f"Write a Python function that wraps `{sig}` and logs each call with its arguments.",
                           f"Write a pytest test for `{q}`."))
    if kind == "code-edit":
        fns = _functions(mod)
        if fns:
            return f"{rng.choice(_EDITS)}\n\n```python\n{rng.choice(fns)}\n```"
    if kind == "summarize" and members:
        docs = [d for _q, _s, d in members if len(d) > 300]
        if docs:
            return f"Summarize this documentation in two sentences:\n\n{rng.choice(docs)[:1500]}"
    if kind == "translate" and members:
        text = C.sentences(C.first_paragraph(rng.choice(members)[2]), 2)
        if len(text.split()) >= 6:
            return f"Translate into {rng.choice(_LANGS)}:\n\n{text}"
    if kind == "lists" and members:
        return rng.choice((f"List the main things the Python module `{mod.name}` is used for.",
                           f"Give five tips for writing code that uses `{short}` well.",
                           f"What are the steps to get started with the `{mod.name}` module?"))
    if kind == "qa-context" and members:
        q, sig, doc = rng.choice(members)
        para = C.first_paragraph(doc)
        if len(para.split()) >= 8:
            return (f"Answer from the context only.\n\nContext: `{sig}`: {para}\n\n"
                    f"Question: what does `{q.split('.')[-1]}` do?")
    if kind == "math":
        a, b, c = rng.randint(3, 40), rng.randint(2, 25), rng.randint(2, 9)
        who, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        return rng.choice((f"{who} buys {a} {item} at {b} dollars each and pays with {c} fifty-dollar notes. "
                           "How much change does "
                           f"{who} get? Show the steps.",
                           f"A box holds {c} {item}. How many boxes are needed for {a * b} {item}? Explain.",
                           f"What is {a} percent of {b * 40}, and what is that number divided by {c}?"))
    if kind == "conversation":
        return rng.choice((f"I need advice on {rng.choice(_TOPICS)}. Where should I start?",
                           f"Can you help me think through {rng.choice(_TOPICS)}?",
                           f"What do people usually get wrong about {rng.choice(_TOPICS)}?"))
    return None


def training_prompts(n: int, seed: int = 0, split: str = "train", kinds=KINDS) -> list[dict]:
    """n prompts, kinds in turn, each from a random module of the split ("train" or "heldout"); a kind that
    yields no new prompt in EXHAUSTED tries in a row drops out of the turn (the first prompts stay those of a
    smaller n). A candidate that
    shares an 8-word run with any benchmark prompt (the suites quote standard-library code and docs too) is
    dropped, so the set is disjoint from evals/suites by construction."""
    tr, va = _modules()
    grams = _suite_grams()
    mods = [m for m in (tr if split == "train" else va) if m.members]
    rng = random.Random(f"{seed}-{split}")
    out, seen, tries = [], set(), 0
    live, misses = list(kinds), 0
    while len(out) < n and tries < 50 * n and live:
        kind = live[len(out) % len(live)]
        tries += 1
        text = _one(kind, rng.choice(mods), rng)
        if text and text not in seen and not _hits(text, grams):
            seen.add(text)
            out.append({"kind": kind, "messages": [{"role": "user", "content": text}]})
            misses = 0
        elif (misses := misses + 1) >= EXHAUSTED:    # a kind with no new prompt left (small word lists):
            live.remove(kind)                        # the others go on in turn
            misses = 0
    return out


EXHAUSTED = 400         # failed tries in a row after which a kind counts as used up


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


WINDOW = 8


def _hits(text: str, grams: dict, window: int = WINDOW) -> str | None:
    w = _words(text)
    for i in range(len(w) - window + 1):
        g = grams.get(" ".join(w[i:i + window]))
        if g is not None:
            return g
    return None


@functools.lru_cache(maxsize=1)
def _suite_grams(window: int = WINDOW) -> dict:
    """Every `window`-word run of every benchmark prompt -> the prompt's id."""
    grams = {}
    for f in sorted(SUITES.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            texts = [row.get("prompt") or ""] + [t.get("content", "") if isinstance(t, dict) else str(t)
                                                 for t in row.get("turns") or row.get("messages") or []]
            for t in texts:
                w = _words(t)
                for i in range(len(w) - window + 1):
                    grams.setdefault(" ".join(w[i:i + window]), row.get("id", f.stem))
    return grams


def overlap_with_suites(prompts: list[dict]) -> list[tuple[str, str]]:
    """(suite prompt id, training prompt) pairs sharing an 8-word run; empty when the sets are disjoint."""
    grams = _suite_grams()
    out = []
    for p in prompts:
        g = _hits(" ".join(m["content"] for m in p["messages"]), grams)
        if g is not None:
            out.append((g, p["messages"][0]["content"][:80]))
    return out


def write_jsonl(path, prompts: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts), encoding="utf-8")
    return path
