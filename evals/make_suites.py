"""Generate the built-in eval suites in evals/suites/ reproducibly: `python -m evals.make_suites`.

Everything is derived from the installed Python standard library (mechanically, with `ast`) plus a few
hand-written prompts, with a fixed random seed, so two runs on the same Python version write identical files.
Where the default model's training corpus is concerned (docstrings, outlines, code), members of modules that
`paradec.training.corpus.is_held_out` marks as held out come first, so the default model never saw them.

Suites (one JSON object per line: id, category, prompt, reference?, chat?, plus informational keys):
  code         raw completion of stdlib-like function beginnings (chat: false)
  docstrings   "What does `module.name` do?"  -> first docstring paragraph
  outlines     "Outline the module `X`."       -> the mechanical numbered outline
  rewrite      input-grounded rewriting (answers copy much of the prompt: prompt-lookup friendly)
  longcontext  passkey retrieval and section look-up in a long document, at ~1k/2k/4k/8k tokens
"""
from __future__ import annotations

import ast
import json
import random
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from paradec.training import corpus as C  # noqa: E402

OUT = ROOT / "evals" / "suites"
SEED = 20260
CHARS_PER_TOKEN = 3.0        # measured on the paradec-tiny tokenizer (English prose and Python source)
N_SUITE = 36

# ------------------------------------------------------------------------------------------------ sources
_MODULES: list[tuple[C.Module, ast.Module]] | None = None


def modules() -> list[tuple[C.Module, ast.Module]]:
    """Every parseable stdlib module (held-out ones first), with its syntax tree."""
    global _MODULES
    if _MODULES is None:
        held, rest = [], []
        for name, path in C.stdlib_files():
            mod = C.parse_module(name, path)
            if mod is None or name.startswith("_"):
                continue
            (held if C.is_held_out(name) else rest).append((mod, ast.parse(mod.source)))
        _MODULES = held + rest
    return _MODULES


def held(mod: C.Module) -> bool:
    return C.is_held_out(mod.name)


def top_functions(mod: C.Module, tree: ast.Module):
    """Top-level public functions with a useful docstring, without decorators."""
    for node in tree.body:
        if (isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and not node.decorator_list
                and C._useful(ast.get_docstring(node))):
            yield node


def _lines(mod: C.Module) -> list[str]:
    return mod.source.splitlines()


# ------------------------------------------------------------------------------------------------ code
HANDWRITTEN_CODE = [
    ("read_config",
     'def read_config(path):\n    """Read an INI-style configuration file and return a dict of its sections.\n\n'
     '    Each section maps option names to their string values.\n    """\n'),
    ("count_words",
     'def count_words(text):\n    """Return a dict mapping each word in text to the number of times it occurs."""\n'),
    ("chunked",
     'def chunked(iterable, size):\n    """Yield successive lists of at most size items from iterable."""\n'),
    ("flatten", 'def flatten(nested):\n    """Return a flat list of the items in a list of lists."""\n'),
    ("is_palindrome",
     'def is_palindrome(s):\n    """Return True if s reads the same forwards and backwards, ignoring case."""\n'),
    ("parse_version",
     'def parse_version(version):\n    """Split a version string such as "3.11.4" into a tuple of integers."""\n'),
    ("human_size",
     'def human_size(n):\n    """Format a number of bytes as a short human-readable string, e.g. "1.5 KB"."""\n'),
    ("merge_dicts",
     'def merge_dicts(*dicts):\n    """Merge several dictionaries into a new one; later values win."""\n'),
    ("strip_comments",
     'def strip_comments(lines):\n'
     '    """Return the lines with everything after a "#" removed and blank lines dropped."""\n'),
    ("unique", 'def unique(items):\n    """Return the items in their original order with duplicates removed."""\n'),
    ("Stack", 'class Stack:\n    """A simple last-in, first-out stack."""\n\n    def __init__(self):\n'),
    ("Timer", 'class Timer:\n    """Context manager that measures the time spent inside its block."""\n\n'
     '    def __enter__(self):\n'),
    ("walk_files",
     'def walk_files(root, suffix):\n    """Return the paths of all files under root whose name ends with suffix."""\n'
     '    result = []\n'),
    ("clamp", 'def clamp(value, low, high):\n    """Return value limited to the range low..high."""\n'),
    ("write_json",
     'def write_json(path, data):\n    """Write data to path as indented JSON, replacing the file atomically."""\n'
     '    import json\n    import os\n'),
    ("fib", 'def fibonacci(n):\n    """Return a list of the first n Fibonacci numbers."""\n'),
]


def code_items() -> list[dict]:
    items = [{"id": f"code-h{i:02d}", "category": "code", "prompt": p, "chat": False, "source": "handwritten"}
             for i, (_, p) in enumerate(HANDWRITTEN_CODE, 1)]
    per_module: dict[str, int] = {}
    mech = []
    for mod, tree in modules():
        lines = _lines(mod)
        for node in top_functions(mod, tree):
            doc_end = node.body[0].end_lineno
            body = lines[doc_end:node.end_lineno]
            head = lines[node.lineno - 1:doc_end]
            if not 3 <= len(body) <= 18 or len(head) > 14 or per_module.get(mod.name, 0) >= 2:
                continue
            if any("\t" in ln for ln in head + body):
                continue
            per_module[mod.name] = per_module.get(mod.name, 0) + 1
            mech.append({"category": "code", "prompt": "\n".join(head) + "\n", "reference": "\n".join(body) + "\n",
                         "chat": False, "source": f"{mod.name}.{node.name}", "held_out": held(mod)})
            break
        if len(items) + len(mech) >= N_SUITE:
            break
    for i, it in enumerate(mech, 1):
        items.append({"id": f"code-s{i:02d}", **it})
    return items


# ------------------------------------------------------------------------------------------------ docstrings
def docstring_items() -> list[dict]:
    chosen: list[tuple[str, str, str]] = []
    by_mod = [(mod, [m for m in mod.members if m[0].count(".") == mod.name.count(".") + 1] or mod.members)
              for mod, _ in modules() if mod.members]
    rnd = 0
    while len(chosen) < N_SUITE + 4 and rnd < 3:   # round robin: at most one member per module per round
        for mod, members in by_mod:
            if rnd < len(members) and (held(mod) or rnd == 0):
                q, _sig, doc = members[rnd]
                chosen.append((q, C.first_paragraph(doc), mod.name))
            if len(chosen) >= N_SUITE + 4:
                break
        rnd += 1
    return [{"id": f"doc-{i:02d}", "category": "docstring", "prompt": C.docstring_question(q), "reference": ref,
             "module": m, "held_out": C.is_held_out(m)} for i, (q, ref, m) in enumerate(chosen, 1)]


# ------------------------------------------------------------------------------------------------ outlines
def outline_items() -> list[dict]:
    out = []
    for mod, _ in modules():
        pts = C.outline_points(mod)
        if not pts or "windows" in mod.name:
            continue
        out.append({"category": "outline", "prompt": C.outline_question(mod.name),
                    "reference": C.render_outline([p for p, _, _ in pts]), "held_out": held(mod),
                    "n_points": len(pts)})
        if len(out) >= N_SUITE:
            break
    return [{"id": f"outline-{i:02d}", **it} for i, it in enumerate(out, 1)]


# ------------------------------------------------------------------------------------------------ rewrite
def _function_source(mod: C.Module, node: ast.FunctionDef) -> str:
    return "\n".join(_lines(mod)[node.lineno - 1:node.end_lineno])


def rewrite_items() -> list[dict]:
    cands = []
    for mod, tree in modules():
        for node in top_functions(mod, tree):
            src = _function_source(mod, node)
            n = src.count("\n") + 1
            if 6 <= n <= 24 and "\t" not in src and len(src) < 1100:
                cands.append((mod, node, src))
                break
    out = []
    templates = ("explain", "repeat", "hints")
    for i, (mod, node, src) in enumerate(cands):
        kind = templates[i % 3]
        q = f"{mod.name}.{node.name}"
        doc = ast.get_docstring(node)
        para = C.first_paragraph(doc)
        if kind == "explain":
            prompt = f"Here is the source of `{q}`:\n\n{src}\n\n{C.docstring_question(q)}"
            ref = para
        elif kind == "repeat":
            prompt = ("Repeat the following docstring word for word, then stop.\n\n"
                      + textwrap.dedent(doc).strip())
            ref = textwrap.dedent(doc).strip()
        else:
            prompt = f"Rewrite this function with type hints, keeping its body and docstring unchanged:\n\n{src}"
            ref = None
        it = {"category": "rewrite", "prompt": prompt, "task": kind, "source": q, "held_out": held(mod)}
        if ref:
            it["reference"] = ref
        out.append(it)
        if len(out) >= N_SUITE:
            break
    return [{"id": f"rewrite-{i:02d}", **it} for i, it in enumerate(out, 1)]


# ------------------------------------------------------------------------------------------------ long context
FILLER = [
    "The morning train left the station a few minutes late.",
    "A light rain fell over the fields for most of the afternoon.",
    "The baker opened the shop early and set out fresh loaves.",
    "Two boats drifted slowly across the still water of the lake.",
    "The old clock in the hall struck the hour with a soft chime.",
    "Children played in the park until the street lamps came on.",
    "The library kept its reading room open late on Thursdays.",
    "A narrow path wound up the hill between rows of olive trees.",
    "The market square filled with stalls selling fruit and cloth.",
    "Snow lay on the mountain tops long after spring had begun.",
    "The ferry crossed the bay twice a day in good weather.",
    "A cat slept on the warm stones beside the garden wall.",
    "The workshop smelled of sawdust, oil and fresh paint.",
    "Clouds gathered in the west as the wind turned cold.",
    "The gardener watered the roses before the sun grew hot.",
    "A long queue formed outside the theatre before the show.",
    "The river ran high after a week of heavy rain in the hills.",
    "An owl called from the woods as the evening grew dark.",
    "The postman whistled as he walked along the quiet lane.",
    "The lighthouse beam swept across the harbour every few seconds.",
    "Fresh bread and coffee were served in the small cafe by the bridge.",
    "The students copied the notes from the board into their books.",
    "A kite rose high above the beach on the steady sea breeze.",
    "The farmer mended the fence along the edge of the meadow.",
]
PASSKEY_INTRO = ("A five-digit pass key is hidden somewhere in the long text below. Read the text, find the "
                 "pass key and remember it; you will be asked for it at the end.\n\n")
PASSKEY_LINE = "The pass key is {key}. Remember it: {key} is the pass key."
PASSKEY_QUESTION = "\n\nWhat is the pass key? The pass key is"


def _filler(rng: random.Random, n_chars: int) -> list[str]:
    out, total = [], 0
    while total < n_chars:
        s = rng.choice(FILLER)
        out.append(s)
        total += len(s) + 1
    return out


def passkey_items(rng: random.Random) -> list[dict]:
    items = []
    for mult in (2, 4, 8, 16):
        tokens = 512 * mult
        for depth in (10, 25, 40, 55, 70, 90):
            key = str(rng.randint(10000, 99999))
            body_chars = int(tokens * CHARS_PER_TOKEN) - len(PASSKEY_INTRO) - len(PASSKEY_QUESTION) - 60
            sents = _filler(rng, body_chars)
            cut = round(len(sents) * depth / 100)
            text = " ".join(sents[:cut] + [PASSKEY_LINE.format(key=key)] + sents[cut:])
            items.append({"category": "longcontext", "prompt": PASSKEY_INTRO + text + PASSKEY_QUESTION,
                          "reference": key, "chat": False, "task": "passkey", "approx_tokens": tokens,
                          "depth_percent": depth})
    return items


def _member_summaries() -> list[tuple[str, str]]:
    """(qualified name, first docstring paragraph) of documented top-level stdlib functions and classes."""
    out = []
    for mod, _ in modules():
        if mod.name.startswith(("encodings.", "tkinter.")):
            continue
        for q, _sig, doc in mod.members:
            para = C.first_paragraph(doc)
            if q.count(".") == mod.name.count(".") + 1 and len(para.split()) >= 8:
                out.append((q, para))
    return out


def section_items(rng: random.Random) -> list[dict]:
    summaries = _member_summaries()
    items = []
    for n_tokens in (1024, 2048, 4096, 8192):       # 2x, 4x, 8x and 16x the default model's context
        pool = rng.sample(summaries, min(len(summaries), 800))
        sections, chars = [], 0
        for name, para in pool:
            if chars > n_tokens * 3.7 - 400:     # docstring prose: ~3.7 characters per token
                break
            sections.append((name, para))
            chars += len(para) + len(name) + 20
        document = "\n\n".join(f"Section {k}: `{name}`\n{para}" for k, (name, para) in enumerate(sections, 1))
        intro = "Below is a reference document with numbered sections, one per function or class.\n\n"
        picks = rng.sample(range(len(sections)), 4)
        for j, k in enumerate(picks):
            name, para = sections[k]
            if j % 2 == 0:
                q = f"Which section describes `{name}`? Answer with the section number."
                ref, task = str(k + 1), "section_number"
            else:
                q = f"Quote the description given in the section about `{name}`."
                ref, task = para, "section_quote"
            items.append({"category": "longcontext", "prompt": intro + document + "\n\n" + q, "reference": ref,
                          "task": task, "approx_tokens": n_tokens, "n_sections": len(sections),
                          "section": k + 1})
    return items


def longcontext_items() -> list[dict]:
    rng = random.Random(SEED)
    out = passkey_items(rng) + section_items(rng)
    return [{"id": f"long-{i:02d}", **it} for i, it in enumerate(out, 1)]


# ------------------------------------------------------------------------------------------------ main
SUITES = {"code": code_items, "docstrings": docstring_items, "outlines": outline_items,
          "rewrite": rewrite_items, "longcontext": longcontext_items}


def write(name: str, items: list[dict]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.jsonl"
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    return path


def main(argv=None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(SUITES)
    for name in names:
        items = SUITES[name]()
        path = write(name, items)
        n_held = sum(1 for it in items if it.get("held_out"))
        print(f"{path.relative_to(ROOT)}: {len(items)} items ({n_held} from held-out modules)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
