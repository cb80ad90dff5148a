"""Generate the built-in eval suites in evals/suites/ reproducibly: `python -m evals.make_suites [NAME ...]`.

The suites are written for an instruction-tuned chat model (the default, Qwen2.5-Coder-0.5B-Instruct): every
prompt is a chat prompt, and each fits, with 256 new tokens per turn, in a 2048-token window. Their material is
either hand-written for this project (evals/suite_sources.py) or derived mechanically, with `ast` and
`tokenize`, from the installed Python standard library; random choices use fixed seeds, so two runs on the same
Python version write identical files (the stdlib-derived items change with the Python version).

Suites (one JSON object per line: id, category, prompt or turns, reference?, plus informational keys):
  conversation   multi-turn chats (`turns`), run turn by turn with the model's own answers; no references
  translation    English <-> French / German / Spanish / Chinese sentences; reference translation (X -> English
                 items list two acceptable translations)
  summarization  a stdlib docstring without its opening summary -> the author's summary paragraph
  qa             short factual questions -> a one-sentence reference answer (some with alternatives)
  math           templated word problems -> the final numeric answer
  rag            a question over 3-5 numbered documents (hand-written passages, stdlib docs) -> the answer
  code           write a function: hand-written tasks with reference solutions, stdlib functions to complete
  code-edit      input-grounded edits of stdlib functions (rename a parameter, remove comments or the docstring,
                 add type hints); references computed mechanically except for type hints
  lists          list-style questions for Skeleton-of-Thought ("What are the main benefits of ...?"); no references
  longcontext    passkey retrieval (in-window controls, then 2x-16x a 512-token window at four depths), key-value
                 retrieval in a JSON object and question answering over a document of numbered stdlib sections;
                 chat prompts sized exactly by the default model's tokenizer (needs it provisioned)

A reference is text, or, where several answers are acceptable, the per-turn form [[alternative, ...]] that
Spec-Bench uses; quality is scored against the best-matching alternative (paradec.quality).
"""
from __future__ import annotations

import ast
import builtins
import inspect
import io
import json
import random
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from evals import suite_sources as S  # noqa: E402
from paradec.training import corpus as C  # noqa: E402

OUT = ROOT / "evals" / "suites"
SEED = 20260
CHARS_PER_TOKEN = 3.0        # measured on the paradec-tiny tokenizer (English prose and Python source); longcontext
N_SUITE = 36
# The chat suites' prompt budget on the default model, estimated without loading a tokenizer. Measured with
# Qwen2.5-Coder-0.5B-Instruct's tokenizer on these suites' prompts: 4.3 characters per token on average (3.8 on
# math, where every digit is a token; 4.4 on longcontext); 3.6 keeps a margin. The largest chat-templated prompt
# is about 510 tokens (summarization); tests/test_evalsets.py counts them exactly when the model is provisioned.
QWEN_CHARS_PER_TOKEN = 3.6
CONTEXT = 2048
NEW_TOKENS = 256

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


def top_functions(mod: C.Module, tree: ast.Module):
    """Top-level public functions with a useful docstring, without decorators."""
    for node in tree.body:
        if (isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and not node.decorator_list
                and C._useful(ast.get_docstring(node))):
            yield node


def _lines(mod: C.Module) -> list[str]:
    return mod.source.splitlines()


# ------------------------------------------------------------------------------------------------ helpers
def _alternatives(ref) -> str | list:
    """A suite reference for one turn: text, or (from a tuple) the per-turn form [[alternative, ...]]."""
    return [list(ref)] if isinstance(ref, tuple) else ref


def estimated_tokens(text: str) -> float:
    """A conservative token estimate for the default model: ASCII at QWEN_CHARS_PER_TOKEN, any other character
    (accents, CJK) as a token of its own."""
    n_ascii = sum(1 for ch in text if ord(ch) < 128)
    return n_ascii / QWEN_CHARS_PER_TOKEN + (len(text) - n_ascii)


def _check_budget(name: str, items: list[dict]) -> None:
    """Every prompt, with NEW_TOKENS generated per turn, fits the default model's CONTEXT window."""
    for it in items:
        turns = it.get("turns") or [it["prompt"]]
        need = sum(estimated_tokens(t) for t in turns) + NEW_TOKENS * len(turns) + 30 * len(turns)  # chat markup
        if need > CONTEXT:
            raise SystemExit(f"{name}: {it['id']} needs about {need:.0f} tokens, over {CONTEXT}")


def _numbered(prefix: str, items: list[dict]) -> list[dict]:
    return [{"id": f"{prefix}-{i:02d}", **it} for i, it in enumerate(items, 1)]


_POOL: list[tuple[C.Module, ast.Module]] | None = None
# platform-specific, internal, and deprecated modules (PEP 594's and the other ones 3.12 removes) stay out
_SKIP = {"encodings", "tkinter", "ctypes", "msilib", "winreg", "idlelib", "lib2to3", "turtle", "turtledemo",
         "ensurepip", "pydoc_data", "distutils", "test", "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt",
         "imghdr", "mailcap", "nis", "nntplib", "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib",
         "uu", "xdrlib", "imp", "asynchat", "asyncore", "smtpd"}


def _pooled(name: str) -> bool:
    parts = name.split(".")
    return (parts[0] not in _SKIP and not any(p.startswith("_") or p in ("test", "tests") for p in parts)
            and "windows" not in name)


def pool() -> list[tuple[C.Module, ast.Module]]:
    """The stdlib modules of `modules()` that `_pooled` keeps, sorted by name (the chat suites do not care
    about paradec-tiny's held-out modules)."""
    global _POOL
    if _POOL is None:
        _POOL = sorted(((m, t) for m, t in modules() if _pooled(m.name)), key=lambda mt: mt[0].name)
    return _POOL


def shuffled_pool(salt: int) -> list[tuple[C.Module, ast.Module]]:
    out = list(pool())
    random.Random(SEED + salt).shuffle(out)
    return out


def _paragraphs(doc: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if p.strip()]


def _joined(text: str) -> str:
    return " ".join(text.split())


def _sentence_like(text: str) -> bool:
    """Prose that reads as a complete statement: starts with a capital letter, no grammar rules, not cut off."""
    return text[:1].isupper() and not text.endswith((":", ",")) and "=" not in text and "->" not in text


def _function_source(mod: C.Module, node: ast.FunctionDef) -> str:
    return "\n".join(_lines(mod)[node.lineno - 1:node.end_lineno])


def _code_block(src: str) -> str:
    return f"```python\n{src.rstrip()}\n```"


# ------------------------------------------------------------------------------------------------ conversation
def conversation_items() -> list[dict]:
    return _numbered("conversation", [{"category": "conversation", "turns": list(turns)}
                                      for turns in S.CONVERSATIONS])


# ------------------------------------------------------------------------------------------------ translation
def translation_items() -> list[dict]:
    out = []
    for src, tgt, text, ref in S.TRANSLATIONS:
        out.append({"category": "translation",
                    "prompt": f"Translate the following text from {src} into {tgt}. Reply with the translation "
                              f"only.\n\n{text}",
                    "reference": _alternatives(ref), "source_language": src, "target_language": tgt})
    return _numbered("translation", out)


# ------------------------------------------------------------------------------------------------ summarization
def summarization_items() -> list[dict]:
    """A stdlib docstring (module, class or function) without its opening summary paragraph; the reference is
    that summary, written by the docstring's author."""
    out = []
    for mod, tree in shuffled_pool(1):
        cands = [("module", mod.name, ast.get_docstring(tree))]
        cands += [("class" if isinstance(n, ast.ClassDef) else "function", f"{mod.name}.{n.name}",
                   ast.get_docstring(n)) for n in tree.body
                  if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
        for kind, qual, doc in cands:
            if not doc or ">>>" in doc or "\t" in doc:
                continue
            paras = _paragraphs(doc)
            summary, rest = _joined(paras[0]) if paras else "", "\n\n".join(paras[1:])
            if (len(paras) < 3 or not 8 <= len(summary.split()) <= 60 or not 500 <= len(rest) <= 2500
                    or not _sentence_like(summary)):
                continue
            out.append({"category": "summarization",
                        "prompt": f"Below is the documentation of the {kind} `{qual}`, without its opening "
                                  f"summary.\n\n{rest}\n\nSummarize in one sentence what the {kind} "
                                  f"`{qual}` is for.",
                        "reference": summary, "source": qual, "kind": kind})
            break
        if len(out) >= N_SUITE:
            break
    return _numbered("summarization", out)


# ------------------------------------------------------------------------------------------------ QA
def qa_items() -> list[dict]:
    return _numbered("qa", [{"category": "qa", "prompt": q, "reference": _alternatives(ref)} for q, ref in S.QA])


# ------------------------------------------------------------------------------------------------ math
def math_items() -> list[dict]:
    rng = random.Random(SEED + 2)
    out = []
    for rep in range(3):
        for name, text, draw in S.MATH_TEMPLATES:
            v = draw(rng)
            answer = v.pop("answer")
            out.append({"category": "math", "prompt": text.format(**v) + S.MATH_SUFFIX, "reference": str(answer),
                        "answer": answer, "template": name})
    return _numbered("math", out)


# ------------------------------------------------------------------------------------------------ RAG
RAG_INSTRUCTION = ("Answer the question using only the documents below, and cite the document you used as [n].")
_PURPOSE_VERBS = ("Return", "Convert", "Create", "Read", "Write", "Remove", "Compute", "Split", "Check", "Encode",
                  "Decode", "Parse", "Make", "Get", "Test", "Format", "Build", "Find", "Translate", "Escape")


def _rag_prompt(docs: list[str], question: str) -> str:
    body = "\n\n".join(f"[{k}] {d}" for k, d in enumerate(docs, 1))
    return f"{RAG_INSTRUCTION}\n\n{body}\n\nQuestion: {question}"


def rag_items() -> list[dict]:
    """Hand-written passages first, then stdlib documentation: four or five members of one module, each as a
    document (its name and the first paragraph of its docstring); the question is about one of them."""
    out = [{"category": "rag", "prompt": _rag_prompt(docs, q), "reference": ref, "source": "handwritten"}
           for docs, q, ref in S.RAG_HANDWRITTEN]
    rng = random.Random(SEED + 3)
    for mod, _tree in shuffled_pool(3):
        members = []
        for q, _sig, doc in mod.members:
            para = _joined(_paragraphs(doc)[0]) if doc else ""
            if (q.count(".") == mod.name.count(".") + 1 and 10 <= len(para.split()) and len(para) <= 360
                    and _sentence_like(para)):
                members.append((q, para))
        if len(members) < 4:
            continue
        picked = rng.sample(members, min(5, len(members)))
        k = rng.randrange(len(picked))
        qual, para = picked[k]
        docs = [f"`{q}`: {p}" for q, p in picked]
        first = C.sentences(para, 1).rstrip(".")
        if len(out) % 2 and first.split()[0] in _PURPOSE_VERBS and len(first.split()) >= 5:
            question = f"Which function or class should I use to {first[0].lower()}{first[1:]}?"
            ref: str | list = [[f"`{qual}` [{k + 1}]", f"`{qual}` [{k + 1}]: {para}"]]
            task = "which"
        else:
            is_class = qual.rsplit(".", 1)[1][:1].isupper()
            question = f"What is `{qual}` for?" if is_class else f"What does `{qual}` do?"
            ref, task = f"{para} [{k + 1}]", "what"
        out.append({"category": "rag", "prompt": _rag_prompt(docs, question), "reference": ref,
                    "source": qual, "task": task, "document": k + 1, "n_documents": len(docs)})
        if len(out) >= N_SUITE:
            break
    return _numbered("rag", out)


# ------------------------------------------------------------------------------------------------ code
def _self_contained(node: ast.FunctionDef) -> bool:
    """The function uses only builtins, its parameters, its own local names and what it imports itself."""
    a = node.args
    known = set(dir(builtins)) | {node.name}
    known |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    loads = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            return False
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else known).add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            known |= {(al.asname or al.name).split(".")[0] for al in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            known.add(n.name)
        elif isinstance(n, ast.arg):
            known.add(n.arg)
    return loads <= known


def code_items() -> list[dict]:
    """Hand-written tasks with reference solutions (and assertions they pass), then self-contained stdlib
    functions to implement from their signature and docstring (the stdlib source is the reference)."""
    out = [{"category": "code", "prompt": task, "reference": ref, "tests": tests, "source": "handwritten"}
           for task, ref, tests in S.CODE_TASKS]
    for mod, tree in shuffled_pool(4):
        lines = _lines(mod)
        for node in top_functions(mod, tree):
            doc_end = node.body[0].end_lineno
            head, body = lines[node.lineno - 1:doc_end], lines[doc_end:node.end_lineno]
            src = "\n".join(head + body)
            if (not 3 <= len(body) <= 15 or len(head) > 14 or "\t" in src or len(node.body) < 2
                    or not _self_contained(node)):
                continue
            out.append({"category": "code",
                        "prompt": "Complete this Python function; reply with the whole function.\n\n"
                                  + _code_block("\n".join(head)),
                        "reference": src + "\n", "source": f"{mod.name}.{node.name}"})
            break
        if len(out) >= N_SUITE:
            break
    return _numbered("code", out)


# ------------------------------------------------------------------------------------------------ code editing
_RENAMES = {"s": "text", "n": "count", "x": "value", "f": "fileobj", "fp": "fileobj", "path": "file_path",
            "name": "item_name", "data": "payload", "obj": "target", "string": "text", "value": "val",
            "filename": "file_name", "text": "content", "key": "lookup_key", "args": "arguments", "a": "first",
            "b": "second", "c": "char", "i": "index", "line": "current_line", "url": "address", "lo": "low",
            "hi": "high", "sep": "separator", "expected": "wanted", "actual": "got", "package": "package_name",
            "readline": "read_line", "source": "src", "src": "source_text", "dst": "destination",
            "func": "function", "fn": "function", "size": "length", "file": "fileobj", "mode": "open_mode",
            "timeout": "timeout_s", "encoding": "charset", "errors": "error_policy", "sock": "connection",
            "win": "window", "delay": "seconds", "argv": "arguments", "HandlerClass": "handler_class"}


def _tokens(src: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(src + "\n").readline))


def _replace_spans(src: str, spans: list[tuple[int, int, int, str]]) -> str:
    """Replace (row, col_start, col_end, text) spans (1-based rows) in src, right to left on each line."""
    lines = src.split("\n")
    for row, c0, c1, text in sorted(spans, reverse=True):
        ln = lines[row - 1]
        lines[row - 1] = ln[:c0] + text + ln[c1:]
    return "\n".join(lines)


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node):
        if node.id == self.old:
            node.id = self.new
        return node

    def visit_arg(self, node):
        if node.arg == self.old:
            node.arg = self.new
        return node


def _rename(src: str, node: ast.FunctionDef) -> tuple[str, str, str] | None:
    """(old, new, renamed source) for the parameter used most in the body, checked against an AST rename."""
    a = node.args
    params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    uses = {p: sum(1 for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == p) for p in params}
    names = {t.string for t in _tokens(src) if t.type == tokenize.NAME}
    for old in sorted(params, key=lambda p: -uses[p]):
        new = _RENAMES.get(old, f"{old}_arg")
        if uses[old] < 2 or new in names:
            continue
        toks = _tokens(src)
        spans = [(t.start[0], t.start[1], t.end[1], new) for i, t in enumerate(toks)
                 if t.type == tokenize.NAME and t.string == old and not (i and toks[i - 1].string == ".")]
        out = _replace_spans(src, spans)
        try:
            got = ast.dump(ast.parse(out))
        except SyntaxError:
            continue
        if got == ast.dump(_Rename(old, new).visit(ast.parse(src))):
            return old, new, out
    return None


def _strip_comments(src: str) -> str | None:
    toks = [t for t in _tokens(src) if t.type == tokenize.COMMENT]
    if len(toks) < 2:
        return None
    lines = src.split("\n")
    for t in toks:
        row, col = t.start
        lines[row - 1] = lines[row - 1][:col].rstrip()
        if not lines[row - 1].strip():
            lines[row - 1] = None
    out = "\n".join(ln for ln in lines if ln is not None)
    try:
        same = ast.dump(ast.parse(out)) == ast.dump(ast.parse(src))
    except SyntaxError:
        return None
    return out if same and "#" not in out else None


def _strip_docstring(src: str) -> str | None:
    tree = ast.parse(src)
    fn = tree.body[0]
    if len(fn.body) < 2 or ast.get_docstring(fn) is None:
        return None
    doc = fn.body[0]
    lines = src.split("\n")
    if lines[doc.lineno - 1][:doc.col_offset].strip() or lines[doc.end_lineno - 1][doc.end_col_offset:].strip():
        return None
    out = "\n".join(lines[:doc.lineno - 1] + lines[doc.end_lineno:])
    fn.body = fn.body[1:]
    try:
        return out if ast.dump(ast.parse(out)) == ast.dump(tree) else None
    except SyntaxError:
        return None


EDIT_INSTRUCTIONS = {
    "rename": "Rename the parameter `{old}` to `{new}` in this function. Change nothing else (strings and comments "
              "stay as they are) and reply with the whole function.",
    "remove-comments": "Remove every comment from this function, keeping the code exactly as it is, and reply with "
                       "the whole function.",
    "remove-docstring": "Remove the docstring from this function, keeping everything else exactly as it is, and "
                        "reply with the whole function.",
    "type-hints": "Add type hints to the parameters and the return value of this function without changing its body "
                  "or its docstring, and reply with the whole function.",
}


def code_edit_items() -> list[dict]:
    """Input-grounded edits of stdlib functions (the answer copies most of the prompt). Every edit but adding
    type hints is mechanical, so its reference is computed (and checked against the syntax tree)."""
    per_kind = N_SUITE // len(EDIT_INSTRUCTIONS)
    chosen: dict[str, list[dict]] = {k: [] for k in EDIT_INSTRUCTIONS}
    used: set[str] = set()
    for kind in ("remove-comments", "rename", "remove-docstring", "type-hints"):     # the rarest first
        for mod, tree in shuffled_pool(5):
            if len(chosen[kind]) >= per_kind:
                break
            if mod.name in used:
                continue
            for node in top_functions(mod, tree):
                src = _function_source(mod, node)
                if not 6 <= src.count("\n") + 1 <= 30 or "\t" in src or len(src) > 1500:
                    continue
                item = {"category": "code-edit", "task": kind, "source": f"{mod.name}.{node.name}"}
                if kind == "rename":
                    r = _rename(src, node)
                    if r is None:
                        continue
                    old, new, ref = r
                    instruction = EDIT_INSTRUCTIONS[kind].format(old=old, new=new)
                    item.update(renamed=old, new_name=new)
                elif kind == "remove-comments":
                    ref, instruction = _strip_comments(src), EDIT_INSTRUCTIONS[kind]
                elif kind == "remove-docstring":
                    ref, instruction = _strip_docstring(src), EDIT_INSTRUCTIONS[kind]
                else:
                    a = node.args
                    args = a.posonlyargs + a.args + a.kwonlyargs
                    if node.returns or not args or any(x.annotation for x in args):
                        continue
                    ref, instruction = None, EDIT_INSTRUCTIONS[kind]
                if ref is None and kind != "type-hints":
                    continue
                item["prompt"] = f"{instruction}\n\n{_code_block(src)}"
                if ref is not None:
                    item["reference"] = ref + "\n"
                chosen[kind].append(item)
                used.add(mod.name)
                break
    out = [it for group in zip(*chosen.values()) for it in group]          # interleaved: any --limit mixes kinds
    return _numbered("code-edit", out)


# ------------------------------------------------------------------------------------------------ lists
def list_items() -> list[dict]:
    return _numbered("lists", [{"category": "lists", "prompt": q} for q in S.LIST_QUESTIONS])


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
LC_WINDOW = 512                        # the nominal window the suite's lengths are multiples of
LC_PASSKEY_MULTIPLES = (2, 4, 8, 16)   # 1K..8K tokens: inputs at 2x-16x a 512-token window
LC_DEPTHS = (10, 35, 60, 85)
LC_CONTROL_TOKENS = 384                # in-window controls: the same task, the whole text fits the window
LC_OTHER_MULTIPLES = (2, 4, 16)        # key-value retrieval and document QA
PASSKEY_INTRO = ("There is a pass key hidden inside a lot of irrelevant text below. Find it and remember it; "
                 "I will ask you for it at the end.\n\n")
PASSKEY_LINE = "The pass key is {key}. Remember it: {key} is the pass key."
PASSKEY_QUESTION = "\n\nWhat is the pass key? Answer with the five digits only."
KV_INTRO = ("The JSON object below maps keys to values. I will ask you for the value of one key at the end.\n\n")
KV_QUESTION = '\n\nWhat is the value of the key "{key}" in the JSON object above? Answer with the value only.'
DOC_INTRO = ("Below is a reference document with numbered sections, one per function or class of the Python "
             "standard library. I will ask you a question about one section at the end.\n\n")


def _chat_tokens(tok, text: str) -> int:
    """Tokens of `text` as a chat prompt under the default model's template (generation prompt included)."""
    out = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True)
    return len(out["input_ids"] if hasattr(out, "keys") else out)


def _fit(tok, build, target: int, hi: int) -> tuple[int, str, int]:
    """The largest n <= hi with build(n) at most `target` chat tokens: (n, text, tokens)."""
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _chat_tokens(tok, build(mid)) <= target:
            lo = mid
        else:
            hi = mid - 1
    text = build(lo)
    return lo, text, _chat_tokens(tok, text)


def _default_tokenizer():
    from transformers import AutoTokenizer

    from paradec.provision import ensure_default
    return AutoTokenizer.from_pretrained(str(ensure_default()))


def passkey_items(rng: random.Random, tok) -> list[dict]:
    items = []
    for target, mult in [(LC_CONTROL_TOKENS, None)] + [(LC_WINDOW * m, m) for m in LC_PASSKEY_MULTIPLES]:
        for depth in LC_DEPTHS:
            key = str(rng.randint(10000, 99999))
            pool = [rng.choice(FILLER) for _ in range(target)]          # more sentences than any fit needs

            def build(n, pool=pool, key=key, depth=depth):
                cut = round(n * depth / 100)
                return (PASSKEY_INTRO + " ".join(pool[:cut] + [PASSKEY_LINE.format(key=key)] + pool[cut:n])
                        + PASSKEY_QUESTION)
            _, text, n_tok = _fit(tok, build, target, len(pool))
            items.append({"category": "longcontext", "prompt": text, "reference": key, "task": "passkey",
                          "approx_tokens": target, "tokens": n_tok, "multiple": mult, "depth_percent": depth,
                          "control": mult is None})
    return items


def kv_items(rng: random.Random, tok) -> list[dict]:
    items = []
    for mult in LC_OTHER_MULTIPLES:
        for depth in (25, 75):
            pairs = [(f"{rng.getrandbits(32):08x}", f"{rng.getrandbits(32):08x}") for _ in range(mult * 60)]

            def build(n, pairs=pairs, depth=depth):
                body = ",\n".join(f'  "{k}": "{v}"' for k, v in pairs[:n])
                ask = pairs[min(n - 1, round((n - 1) * depth / 100))][0]
                return KV_INTRO + "{\n" + body + "\n}" + KV_QUESTION.format(key=ask)
            n, text, n_tok = _fit(tok, build, LC_WINDOW * mult, len(pairs))
            k, v = pairs[min(n - 1, round((n - 1) * depth / 100))]
            items.append({"category": "longcontext", "prompt": text, "reference": v, "task": "kv",
                          "approx_tokens": LC_WINDOW * mult, "tokens": n_tok, "multiple": mult,
                          "depth_percent": depth, "key": k, "pairs": n})
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


def _first_sentence(para: str) -> str:
    return re.split(r"(?<=[.!?])\s+", para)[0]


def docqa_items(rng: random.Random, tok) -> list[dict]:
    """A document of numbered stdlib sections and a question whose answer is in one section: which section
    describes a given name (answer: its number), or which name a section's first sentence describes."""
    summaries = _member_summaries()
    items = []
    for mult in LC_OTHER_MULTIPLES:
        pool = rng.sample(summaries, min(len(summaries), mult * 40))
        for depth, task in ((30, "section_number"), (70, "name_lookup")):
            def doc(n):
                return "\n\n".join(f"Section {k}: `{name}`\n{para}" for k, (name, para) in enumerate(pool[:n], 1))

            def pick(n):
                # the section nearest the depth whose first sentence is unique in the document and not its name
                order = sorted(range(n), key=lambda i: abs(i - round((n - 1) * depth / 100)))
                firsts = [_first_sentence(p) for _, p in pool[:n]]
                return next(i for i in order if firsts.count(firsts[i]) == 1 and len(firsts[i].split()) >= 6
                            and pool[i][0].rsplit(".", 1)[-1] not in firsts[i])

            def question(n):
                i = pick(n)
                name, para = pool[i]
                if task == "section_number":
                    return f"Which section describes `{name}`? Answer with the section number only.", str(i + 1)
                return (f'Which function or class does the document describe with these words: "{_first_sentence(para)}"'
                        " Answer with its name only.", name)

            def build(n):
                return DOC_INTRO + doc(n) + "\n\n" + question(n)[0]
            n, text, n_tok = _fit(tok, build, LC_WINDOW * mult, len(pool))
            i = pick(n)
            items.append({"category": "longcontext", "prompt": text, "reference": question(n)[1], "task": task,
                          "approx_tokens": LC_WINDOW * mult, "tokens": n_tok, "multiple": mult,
                          "depth_percent": round(100 * i / max(1, n - 1)), "n_sections": n, "section": i + 1})
    return items


def longcontext_items(tok=None) -> list[dict]:
    """Passkey (in-window controls and 2x-16x a 512-token window, four depths), key-value retrieval and
    document QA, chat prompts sized by the default model's tokenizer (its chat template included)."""
    tok = tok or _default_tokenizer()
    rng = random.Random(SEED)
    out = passkey_items(rng, tok) + kv_items(rng, tok) + docqa_items(rng, tok)
    return [{"id": f"long-{i:02d}", **it} for i, it in enumerate(out, 1)]


# ------------------------------------------------------------------------------------------------ main
SUITES = {"conversation": conversation_items, "translation": translation_items,
          "summarization": summarization_items, "qa": qa_items, "math": math_items, "rag": rag_items,
          "code": code_items, "code-edit": code_edit_items, "lists": list_items, "longcontext": longcontext_items}


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
        if name not in SUITES:
            raise SystemExit(f"unknown suite {name!r}; suites: {', '.join(SUITES)}")
        items = SUITES[name]()
        if name != "longcontext":
            _check_budget(name, items)
        path = write(name, items)
        n_ref = sum(1 for it in items if it.get("reference") is not None)
        print(f"{path.relative_to(ROOT)}: {len(items)} items, {n_ref} with a reference")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
