"""The training corpus every machine with Python has: the standard library.

Three kinds of text come out of it, all derived mechanically (no network, no hand labels):

* raw text  - the source of every pure-Python standard-library module (tests and idlelib left out),
  the pydoc topic help texts, and Debian's python3-doc text files where installed;
* docstring questions - "What does `json.dumps` do?" answered by the first paragraph of its docstring;
* outlines - "Outline the module `json`." answered by a numbered list of 3-10 short points (one per
  documented public function or class), and "Expand point b of that outline." answered by
  "b. <point>: <one or two sentences>" taken from that member's docstring.

Modules are split into train and held-out by a stable hash of their dotted name, so the validation
perplexity and the format-following rates are measured on modules the model never saw.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

SKIP_PARTS = {"test", "tests", "idlelib", "site-packages", "__pycache__", "turtledemo", "lib2to3"}
HELD_OUT_EVERY = 10          # 1 module in 10 is held out
MAX_DOC_CHARS = 360


def is_held_out(module: str) -> bool:
    return int(hashlib.sha1(module.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


@dataclass
class Module:
    name: str
    source: str
    members: list[tuple[str, str, str]] = field(default_factory=list)  # (qualified name, signature, docstring)


def stdlib_files() -> list[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(p in SKIP_PARTS for p in rel.parts) or rel.parts[0].startswith(("config-", "__")):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not parts:
            continue
        out.append((".".join(parts), path))
    return out


def _signature(node: ast.AST) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
        if node.args.vararg:
            args.append("*" + node.args.vararg.arg)
        args += [a.arg for a in node.args.kwonlyargs]
        if node.args.kwarg:
            args.append("**" + node.args.kwarg.arg)
        return f"{node.name}({', '.join(args)})"
    return node.name


def _useful(doc: str | None) -> bool:
    return bool(doc) and len(doc.split()) >= 4


def parse_module(name: str, path: Path) -> Module | None:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return None
    mod = Module(name, source)
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if _useful(doc):
            mod.members.append((f"{name}.{node.name}", _signature(node), doc))
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and not sub.name.startswith("_"):
                    sdoc = ast.get_docstring(sub)
                    if _useful(sdoc):
                        mod.members.append((f"{name}.{node.name}.{sub.name}", _signature(sub), sdoc))
    return mod


def first_paragraph(doc: str) -> str:
    para = re.split(r"\n\s*\n", doc.strip())[0]
    para = " ".join(para.split())
    if len(para) > MAX_DOC_CHARS:
        cut = para[:MAX_DOC_CHARS]
        para = cut[: cut.rfind(" ")] + " ..."
    return para


def sentences(text: str, n: int) -> str:
    parts = re.split(r"(?<=[.!?])\s+", text)
    return " ".join(parts[:n])


def short_point(summary: str, words: int = 6) -> str:
    first = sentences(summary, 1).rstrip(".")
    ws = first.split()
    return " ".join(ws[:words])


def outline_points(mod: Module) -> list[tuple[str, str, str]]:
    """(point text, signature, docstring) for top-level members, 3-10 of them, or [] if too few."""
    top = [(q, s, d) for q, s, d in mod.members if q.count(".") == mod.name.count(".") + 1]
    seen, pts = set(), []
    for q, s, d in top:
        short = q.rsplit(".", 1)[1]
        if short in seen:
            continue
        seen.add(short)
        pts.append((f"{short}: {short_point(first_paragraph(d))}", s, d))
        if len(pts) == 10:
            break
    return pts if len(pts) >= 3 else []


def render_outline(points: list[str]) -> str:
    return "\n".join(f"{i}. {p}" for i, p in enumerate(points, 1))


def outline_question(module: str) -> str:
    return f"Outline the module `{module}`."


def docstring_question(qualname: str) -> str:
    return f"What does `{qualname}` do?"


EXPAND_QUESTION = "Expand point {b} of that outline."


def expansion_answer(b: int, point: str, signature: str, doc: str) -> str:
    return f"{b}. {point}. `{signature}`: {sentences(first_paragraph(doc), 2)}"


def chat_examples(mod: Module) -> list[list[dict]]:
    """All instruction conversations derived from one module."""
    convs = []
    for q, _sig, d in mod.members:
        convs.append([{"role": "user", "content": docstring_question(q)},
                      {"role": "assistant", "content": first_paragraph(d)}])
    pts = outline_points(mod)
    if pts:
        outline = render_outline([p for p, _, _ in pts])
        convs.append([{"role": "user", "content": outline_question(mod.name)},
                      {"role": "assistant", "content": outline}])
        for b, (p, s, d) in enumerate(pts, 1):
            convs.append([{"role": "user", "content": outline_question(mod.name)},
                          {"role": "assistant", "content": outline},
                          {"role": "user", "content": EXPAND_QUESTION.format(b=b)},
                          {"role": "assistant", "content": expansion_answer(b, p, s, d)}])
    return convs


def pydoc_topics() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [topics[k] for k in sorted(topics)]


def debian_doc_texts(limit_bytes: int = 8_000_000) -> list[str]:
    root = Path("/usr/share/doc/python3-doc/html/_sources")
    if not root.is_dir():
        return []
    out, total = [], 0
    for p in sorted(root.rglob("*.txt")):
        t = p.read_text(encoding="utf-8", errors="ignore")
        out.append(t)
        total += len(t)
        if total > limit_bytes:
            break
    return out


@dataclass
class Corpus:
    train_raw: list[str]
    val_raw: list[str]
    train_chat: list[list[dict]]
    val_chat: list[list[dict]]
    train_modules: list[Module]
    val_modules: list[Module]


def build_corpus() -> Corpus:
    tr_raw, va_raw, tr_chat, va_chat, tr_mod, va_mod = [], [], [], [], [], []
    for name, path in stdlib_files():
        mod = parse_module(name, path)
        if mod is None:
            continue
        held = is_held_out(name)
        (va_raw if held else tr_raw).append(mod.source)
        (va_chat if held else tr_chat).extend(chat_examples(mod))
        (va_mod if held else tr_mod).append(mod)
    docs = pydoc_topics() + debian_doc_texts()
    for i, t in enumerate(docs):
        (va_raw if i % HELD_OUT_EVERY == 0 else tr_raw).append(t)
    return Corpus(tr_raw, va_raw, tr_chat, va_chat, tr_mod, va_mod)


if __name__ == "__main__":  # quick look at the corpus sizes
    c = build_corpus()
    print(len(c.train_raw), sum(map(len, c.train_raw)), len(c.val_raw), sum(map(len, c.val_raw)))
    print(len(c.train_chat), len(c.val_chat), len(c.train_modules), len(c.val_modules))
    print(sum(1 for m in c.val_modules if outline_points(m)), "held-out modules with outlines")
    print(c.train_chat[0])
    for cv in c.train_chat:
        if len(cv) == 4:
            print(cv)
            break
    os.sys.exit(0)
