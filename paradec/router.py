"""The SoT-R router: does a question want an answer made of independent points (use SoT) or not (use `ar`)?

A logistic regression over word unigram + bigram features, trained without network on the labelled prompts
in evals/router_labels.jsonl by `train_router()` (CLI: `python -m paradec train router`) and saved as a small
JSON of weights at data/router.json. When that file is missing or unreadable the router falls back to a
keyword rule. Classifying one question costs microseconds; `sot-r` records the time in its first Step.

Split: line i (0-based) of the labels file is held out when i % held_out_every == held_out_every - 1
(every 4th line by default). The shipped weights are trained on the training split only, so the held-out
accuracy stored in the file's metadata describes exactly the weights that ship.
"""
from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABELS = ROOT / "evals" / "router_labels.jsonl"
ROUTER = ROOT / "data" / "router.json"
LIST, OTHER = "list", "other"

_CODE = re.compile(r"`[^`]*`")
_WORD = re.compile(r"[a-z]+|\d+|[=+*/^%<>]|\?")


def features(text: str) -> list[str]:
    """Lower-cased words with code spans and numbers collapsed, as unigrams and bigrams (with a start mark)."""
    t = _CODE.sub(" zcodez ", text.lower())
    if re.search(r"\bdef |\bclass |\breturn\b|[{};]\s*$|^\s*(import|from) ", text, re.M):
        t += " zsourcez"
    words = ["<s>"] + [("znumz" if w.isdigit() else w) for w in _WORD.findall(t)]
    feats = [w for w in words[1:]]
    feats += [f"{a} {b}" for a, b in zip(words, words[1:])]
    return feats


LIST_CUES = re.compile(r"\b(outline|list|ways|steps|tips|features|advantages|disadvantages|benefits|drawbacks|"
                       r"reasons|differences|pros|cons|factors|types|kinds|examples|ideas|strategies|methods|"
                       r"practices|components|parts|main|key|overview|causes|effects|consequences|suggest)\b", re.I)
OTHER_CUES = re.compile(r"(\bdef |\breturn\b|\bcomplete\b|\brewrite\b|\btranslate\b|\bsolve\b|\bcompute\b|"
                        r"\bcalculate\b|\bhow many\b|\bhow much\b|\bprove\b|\bfix\b|\bpoem\b|\bstory\b|"
                        r"\bsummar|\d\s*[-+*/^=]\s*\d)", re.I)


def keyword_prob(text: str) -> float:
    """The fallback rule: list cue words and no cue of math, code, rewriting or creative writing."""
    if OTHER_CUES.search(text):
        return 0.1
    return 0.9 if LIST_CUES.search(text) else 0.2


@dataclass
class Router:
    weights: dict[str, float] = field(default_factory=dict)
    bias: float = 0.0
    source: str = "keywords"      # "model" (trained weights) or "keywords" (fallback rule)
    meta: dict = field(default_factory=dict)

    def prob(self, text: str) -> float:
        """P(the question wants a list of independent points)."""
        if self.source != "model":
            return keyword_prob(text)
        z = self.bias + sum(self.weights.get(f, 0.0) for f in features(text))
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))

    def is_list(self, text: str, threshold: float = 0.5) -> bool:
        return self.prob(text) >= threshold


_cached: dict = {}


def load_router(path: str | Path | None = None) -> Router:
    """The trained router at `path` (default data/router.json), or the keyword rule when it is missing."""
    path = Path(path) if path else ROUTER
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return Router()
    hit = _cached.get(str(path))
    if hit and hit[0] == mtime:
        return hit[1]
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        r = Router({str(k): float(v) for k, v in d["weights"].items()}, float(d["bias"]), "model", d.get("meta", {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Router()
    _cached[str(path)] = (mtime, r)
    return r


def read_labels(path: str | Path = LABELS) -> list[tuple[str, int]]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        if d.get("label") not in (LIST, OTHER) or not isinstance(d.get("prompt"), str):
            raise ValueError(f"{path}:{n}: each line needs a prompt and a label of {LIST!r} or {OTHER!r}")
        rows.append((d["prompt"], 1 if d["label"] == LIST else 0))
    return rows


def split(rows: list, held_out_every: int = 4) -> tuple[list, list]:
    train = [r for i, r in enumerate(rows) if i % held_out_every != held_out_every - 1]
    held = [r for i, r in enumerate(rows) if i % held_out_every == held_out_every - 1]
    return train, held


def fit(rows: list[tuple[str, int]], epochs: int = 200, lr: float = 0.5, l2: float = 1e-3,
        seed: int = 0) -> tuple[dict[str, float], float]:
    """Logistic regression by plain stochastic gradient descent over binary n-gram features."""
    rng = random.Random(seed)
    data = [(sorted(set(features(t))), y) for t, y in rows]
    w: dict[str, float] = {}
    b = 0.0
    order = list(range(len(data)))
    for _ in range(epochs):
        rng.shuffle(order)
        for i in order:
            fs, y = data[i]
            z = b + sum(w.get(f, 0.0) for f in fs)
            g = 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z)))) - y
            b -= lr * g
            for f in fs:
                w[f] = w.get(f, 0.0) * (1 - lr * l2) - lr * g
    return {f: round(v, 5) for f, v in w.items() if abs(v) > 1e-4}, round(b, 5)


def accuracy(router: Router, rows: list[tuple[str, int]], threshold: float = 0.5) -> float:
    if not rows:
        return float("nan")
    return sum(int(router.prob(t) >= threshold) == y for t, y in rows) / len(rows)


def train_router(labels: str | Path = LABELS, out: str | Path | None = ROUTER, held_out_every: int = 4,
                 epochs: int = 200, lr: float = 0.5, l2: float = 1e-3, seed: int = 0) -> dict:
    """Train the router on the training split of `labels`, evaluate on the held-out split, write `out`.

    Returns the metadata stored in the file: counts, train / held-out accuracy of the shipped weights, the
    keyword rule's held-out accuracy for comparison, and the held-out prompts it gets wrong.
    """
    rows = read_labels(labels)
    train, held = split(rows, held_out_every)
    t0 = time.perf_counter()
    w, b = fit(train, epochs, lr, l2, seed)
    r = Router(w, b, "model")
    kw = Router()
    meta = {
        "kind": "logistic regression over word unigrams + bigrams",
        "labels": str(Path(labels).resolve().relative_to(ROOT)) if Path(labels).resolve().is_relative_to(ROOT)
        else str(labels),
        "examples": len(rows), "train": len(train), "held_out": len(held),
        "held_out_rule": f"line index % {held_out_every} == {held_out_every - 1}",
        "train_accuracy": round(accuracy(r, train), 4),
        "held_out_accuracy": round(accuracy(r, held), 4),
        "keyword_rule_held_out_accuracy": round(accuracy(kw, held), 4),
        "held_out_errors": [t for t, y in held if int(r.prob(t) >= 0.5) != y],
        "features": len(w), "epochs": epochs, "lr": lr, "l2": l2, "seed": seed,
        "train_seconds": round(time.perf_counter() - t0, 3),
    }
    if out:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"meta": meta, "bias": b, "weights": dict(sorted(w.items()))}, indent=1),
                       encoding="utf-8")
        tmp.replace(out)
    return meta
