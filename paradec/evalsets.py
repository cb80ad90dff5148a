"""Eval sets: parse and validate user uploads, and the built-in suites in evals/suites/.

Accepted files (UTF-8; at most `max_bytes`):
  * CSV  - a header row with a `prompt` column; optional `id`, `category`, `reference`, `chat` columns.
  * JSONL - one object per line: {"prompt": ..., "id"?, "category"?, "reference"?, "chat"?}; other keys are
    kept as the item's `meta`.
  * Spec-Bench / MT-bench questions (JSONL) - {"question_id": .., "category": .., "turns": ["..", ".."],
    "reference": [..]?}: one item with several user turns. `reference` is one entry per turn (text, null, or a
    list of acceptable texts, as Spec-Bench gives some turns: [["a source of lumber", "purifying water"]]);
    every alternative is kept and quality is scored against the best-matching one (paradec.quality).
  * .json - a JSON array of such objects (or JSONL content under a .json name).

Every row-level problem is collected (up to `MAX_ERRORS`) and raised together as one `EvalSetError` whose
message names the file, the line/row (1-based) and the problem. Nothing is stored by this module; the
store saves a parsed set in one transaction.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
SUITES_DIR = ROOT / "evals" / "suites"
SAMPLES_DIR = ROOT / "evals" / "samples"
MAX_BYTES = 5_000_000
MAX_ERRORS = 50
EXTENSIONS = (".csv", ".jsonl", ".ndjson", ".json")
DEFAULT_CATEGORY = "general"
_TRUE = {"true", "1", "yes", "y"}
_FALSE = {"false", "0", "no", "n"}


class EvalSetError(ValueError):
    """An eval-set file is unusable. `.errors` lists every problem found (each 'line N: ...')."""

    def __init__(self, message: str, errors: list[str] | None = None, filename: str = ""):
        super().__init__(message)
        self.errors = list(errors or [message])
        self.filename = filename


def alternatives(ref) -> list[str]:
    """The acceptable answers of one turn's reference, as a list (empty without a reference)."""
    if ref is None:
        return []
    return [ref] if isinstance(ref, str) else [r for r in ref if isinstance(r, str)]


@dataclass
class EvalItem:
    item_id: str
    category: str = DEFAULT_CATEGORY
    turns: list[str] = field(default_factory=list)
    reference: str | None = None                  # the reference answer to the first turn (its first alternative)
    references: list | None = None                # one per turn: text, a list of acceptable texts, or None
    chat: bool = True                             # False: run as raw completion (no chat template)
    meta: dict = field(default_factory=dict)      # any other keys of the source row

    def __post_init__(self):
        if self.references is None and self.reference is not None:
            self.references = [self.reference] + [None] * (len(self.turns) - 1)
        elif self.references is not None and self.reference is None:
            first = alternatives(self.references[0]) if self.references else []
            self.reference = first[0] if first else None

    @property
    def prompt(self) -> str:
        return self.turns[0]

    def reference_for(self, turn: int) -> str | list[str] | None:
        """The reference of one turn: text, a list of acceptable texts, or None."""
        refs = self.references or []
        return refs[turn] if turn < len(refs) else None


@dataclass
class EvalSet:
    name: str
    format: str                                   # 'csv' | 'jsonl' | 'specbench'
    items: list[EvalItem]
    source_filename: str = ""

    def __len__(self) -> int:
        return len(self.items)

    @property
    def categories(self) -> list[str]:
        return sorted({it.category for it in self.items})


# ---------------------------------------------------------------------------------------------- loading
def load_eval_set(path_or_bytes, filename: str | None = None, max_prompt_tokens: int | None = None,
                  count_tokens: Callable[[str], int] | None = None, max_bytes: int = MAX_BYTES,
                  name: str | None = None) -> EvalSet:
    """Parse and validate an eval-set file (a path, or its bytes plus `filename`). Raises EvalSetError."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        if not filename:
            raise EvalSetError("an uploaded eval set needs its file name (to tell CSV from JSONL)")
        fname = Path(filename).name
        size = len(path_or_bytes)
        data = None if size > max_bytes else bytes(path_or_bytes)
    else:
        path = Path(os.fspath(path_or_bytes))
        fname = Path(filename).name if filename else path.name
        if not path.is_file():
            raise EvalSetError(f"{fname}: no such file", filename=fname)
        size = path.stat().st_size
        data = None if size > max_bytes else path.read_bytes()

    ext = Path(fname).suffix.lower()
    if ext not in EXTENSIONS:
        shown = f"'{ext}'" if ext else "no extension"
        raise EvalSetError(f"{fname}: unknown file type ({shown}); upload a .csv or .jsonl file "
                           "(or Spec-Bench question.jsonl)", filename=fname)
    if data is None:
        raise EvalSetError(f"{fname}: the file is {size:,} bytes, over the limit of {max_bytes:,} bytes; "
                           "split it into smaller eval sets", filename=fname)
    if not data.strip():
        raise EvalSetError(f"{fname}: the file is empty", filename=fname)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise EvalSetError(f"{fname}: line {line}: the file is not valid UTF-8 text (byte 0x{data[e.start]:02x}); "
                           "save it as UTF-8 and upload it again", filename=fname) from None

    nul = [f"line {n}: contains a NUL character (\\0); remove it" for n, ln in enumerate(text.splitlines(), 1)
           if "\x00" in ln]
    if nul:    # a binary file, or text that no tokenizer and no report should see
        shown = "; ".join(nul[:3]) + (f" (and {len(nul) - 3} more)" if len(nul) > 3 else "")
        raise EvalSetError(f"{fname}: {shown}", errors=nul[:MAX_ERRORS], filename=fname)
    if ext == ".csv":
        records, fmt, errors = _csv_records(text)
    else:
        records, fmt, errors = _json_records(text, ext)

    items, seen = [], {}
    for label, rec in records:
        if len(errors) >= MAX_ERRORS:
            break
        item = _item(label, rec, len(items) + 1, errors)
        if item is None:
            continue
        if item.item_id in seen:
            errors.append(f"{label}: duplicate id {item.item_id!r} (already used on {seen[item.item_id]})")
            continue
        seen[item.item_id] = label
        if count_tokens is not None and max_prompt_tokens is not None:
            n = sum(int(count_tokens(t)) for t in item.turns)
            if n > max_prompt_tokens:
                errors.append(f"{label}: the prompt is {n:,} tokens, longer than the model's context allows "
                              f"({max_prompt_tokens:,} tokens)")
                continue
        items.append(item)
        if fmt == "jsonl" and len(item.turns) > 1:
            fmt = "specbench"

    if errors:
        errors = errors[:MAX_ERRORS]
        shown = "; ".join(errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        head = f"{fname}: " + (f"{len(errors)} problems: " if len(errors) > 1 else "")
        raise EvalSetError(head + shown + more, errors=errors, filename=fname)
    if not items:
        raise EvalSetError(f"{fname}: no prompts found in the file", filename=fname)
    return EvalSet(name=name or Path(fname).stem, format=fmt, items=items, source_filename=fname)


def _csv_records(text: str) -> tuple[list, str, list[str]]:
    first = text.split("\n", 1)[0]
    delim = ","
    if "," not in first:
        delim = "\t" if "\t" in first else ";" if ";" in first else ","
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delim)
    errors: list[str] = []
    try:
        header = next(reader)
    except csv.Error as e:
        return [], "csv", [f"line 1: the header row is not valid CSV ({e})"]
    cols = [h.strip().lower() for h in header]
    if "prompt" not in cols:
        found = ", ".join(repr(c) for c in cols if c) or "none"
        return [], "csv", [f"line 1: missing column `prompt` (the header has columns {found}); the first row "
                           "must name the columns and one of them must be `prompt`"]
    records = []
    row_no = 0
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            errors.append(f"line {line}: not valid CSV ({e})")
            break
        if not any(cell.strip() for cell in row):
            continue            # blank line or a spreadsheet's empty trailing row
        row_no += 1
        label = f"row {row_no} (line {line})"
        if len(row) != len(cols):
            errors.append(f"{label}: has {len(row)} fields but the header has {len(cols)} "
                          "(a comma inside a prompt needs the prompt in double quotes)")
            continue
        rec = {c: v for c, v in zip(cols, row) if c}
        for k in ("id", "category", "reference", "chat"):
            if k in rec and not rec[k].strip():
                del rec[k]
        records.append((label, rec))
    if not records and not errors:
        errors.append("line 2: the file has a header but no rows; add one prompt per row")
    return records, "csv", errors


def _json_records(text: str, ext: str) -> tuple[list, str, list[str]]:
    errors: list[str] = []
    records = []
    if ext == ".json" and text.lstrip().startswith("["):
        try:
            arr = json.loads(text)
        except json.JSONDecodeError as e:
            return [], "jsonl", [f"line {e.lineno}: invalid JSON ({e.msg}, column {e.colno})"]
        if not isinstance(arr, list):
            return [], "jsonl", ["line 1: expected a JSON array of objects"]
        records = [(f"item {i}", obj) for i, obj in enumerate(arr, 1)]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"line {n}: invalid JSON ({e.msg}, column {e.colno})")
                if len(errors) >= MAX_ERRORS:
                    break
                continue
            records.append((f"line {n}", obj))
    fmt = "specbench" if any(isinstance(o, dict) and "turns" in o for _, o in records) else "jsonl"
    return records, fmt, errors


def _text_field(rec: dict, key: str, label: str, errors: list[str]) -> str | None:
    v = rec.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        errors.append(f"{label}: `{key}` must be text, got {type(v).__name__}")
        return None
    return str(v).strip()


def _references(ref, n_turns: int, label: str, errors: list[str]) -> list | None:
    """`reference` as one entry per turn: text, a list of acceptable texts (two or more; a single one becomes
    text), or None; None overall when no turn has one. A malformed entry is a row-level error."""
    if ref is None:
        return None
    if isinstance(ref, str):
        return [ref] + [None] * (n_turns - 1) if ref.strip() else None
    if not isinstance(ref, list):
        errors.append(f"{label}: `reference` must be text, or a list with one entry per turn (text, or a list of "
                      f"acceptable texts), got {type(ref).__name__}")
        return None
    if len(ref) > n_turns:
        errors.append(f"{label}: `reference` has {len(ref)} entries but the item has {n_turns} turn(s); give one "
                      "entry per turn, and a turn's acceptable answers as a list inside it, e.g. [[\"a\", \"b\"]]")
        return None
    out: list = []
    for t, r in enumerate(ref, 1):
        if r is None or isinstance(r, str):
            out.append(r if r is None or r.strip() else None)
        elif isinstance(r, list) and all(isinstance(x, str) for x in r):
            alts = [x for x in r if x.strip()]
            out.append(None if not alts else alts[0] if len(alts) == 1 else alts)
        else:
            bad = next((x for x in r if not isinstance(x, str)), None) if isinstance(r, list) else r
            errors.append(f"{label}: the reference for turn {t} must be text or a list of texts (acceptable "
                          f"answers), got {type(bad).__name__} {json.dumps(bad)[:40]}")
            return None
    out += [None] * (n_turns - len(out))
    return out if any(r is not None for r in out) else None


def _item(label: str, rec, position: int, errors: list[str]) -> EvalItem | None:
    if not isinstance(rec, dict):
        errors.append(f"{label}: expected a JSON object with a `prompt`, got {type(rec).__name__}")
        return None
    n_err = len(errors)
    # the user turns
    if "turns" in rec and rec["turns"] is not None:
        turns = rec["turns"]
        if not isinstance(turns, list) or not turns:
            errors.append(f"{label}: `turns` must be a non-empty list of prompts")
            return None
        for t, v in enumerate(turns, 1):
            if not isinstance(v, str):
                errors.append(f"{label}: turn {t} must be text, got {type(v).__name__}")
                return None
            if not v.strip():
                errors.append(f"{label}: turn {t} is an empty prompt")
                return None
    elif "prompt" in rec:
        p = rec["prompt"]
        if p is None or (isinstance(p, str) and not p.strip()):
            errors.append(f"{label}: empty prompt")
            return None
        if not isinstance(p, str):
            errors.append(f"{label}: `prompt` must be text, got {type(p).__name__}")
            return None
        turns = [p]
    else:
        errors.append(f"{label}: missing key `prompt` (or Spec-Bench `turns`)")
        return None
    # id, category
    raw_id = rec.get("id", rec.get("question_id"))
    if isinstance(raw_id, bool) or (raw_id is not None and not isinstance(raw_id, (str, int))):
        errors.append(f"{label}: `id` must be text or a whole number, got {raw_id!r}")
        return None
    item_id = str(raw_id).strip() if raw_id is not None and str(raw_id).strip() else str(position)
    if len(item_id) > 200:
        errors.append(f"{label}: the id is {len(item_id)} characters; at most 200")
        return None
    category = _text_field(rec, "category", label, errors) or DEFAULT_CATEGORY
    # references
    references = _references(rec.get("reference"), len(turns), label, errors)
    if len(errors) > n_err:
        return None
    # chat / raw completion
    chat = rec.get("chat", True)
    if isinstance(chat, str):
        c = chat.strip().lower()
        chat = True if c in _TRUE else False if c in _FALSE else None
    if not isinstance(chat, bool):
        errors.append(f"{label}: `chat` must be true or false, got {rec.get('chat')!r}")
        return None
    texts = [*turns, item_id, category, *(a for r in references or [] for a in alternatives(r))]
    if any("\x00" in t for t in texts):     # a JSON "\u0000" escape
        errors.append(f"{label}: contains a NUL character (\\u0000); remove it")
    if len(errors) > n_err:
        return None
    meta = {k: v for k, v in rec.items()
            if k not in ("id", "question_id", "category", "prompt", "turns", "reference", "chat")}
    return EvalItem(item_id=item_id, category=category, turns=list(turns), references=references, chat=chat,
                    meta=meta)


# ---------------------------------------------------------------------------------------------- suites
def builtin_suites() -> dict[str, Path]:
    """Built-in suites: {name: path} for evals/suites/*.jsonl."""
    return {p.stem: p for p in sorted(SUITES_DIR.glob("*.jsonl"))}


def load_suite(name: str, **kw) -> EvalSet:
    suites = builtin_suites()
    if name not in suites:
        raise EvalSetError(f"unknown suite {name!r}; built-in suites: {', '.join(suites) or 'none'}")
    kw.setdefault("max_bytes", 50_000_000)
    return load_eval_set(suites[name], name=name, **kw)
