"""`sps`: speculative decoding with a separate draft model (Leviathan et al. 2023; Chen et al. 2023).

Each step: the draft model proposes k tokens one at a time with its own KV cache (k draft passes), then one
target forward pass over the uncached tokens plus the k proposals scores all k+1 positions. Greedy requests
keep the longest prefix equal to the target's argmax (output == `ar`); sampled requests use rejection
sampling (`verification.rejection`), which leaves the output distributed exactly as the target's. Both
caches are cropped back to the accepted tokens. With `adaptive` on, k changes after every step by one of two rules
(`rule`): "cost" (the default) keeps a running estimate of the per-token acceptance rate (counts of accepted and
rejected proposals, the older ones decayed) and takes the k that maximises the expected tokens per second, with
(1 - a^(k+1)) / (1 - a) tokens expected from a step that costs one target pass over k+1 positions plus k draft
passes, both costs measured on this engine (paradec/passcost.py): on a CPU a draft pass is a sizeable share of a
target pass and wide target passes can cost more than narrow ones, which transformers' rule, "transformers", does
not see: +2 after a step where every proposal was accepted, -1 otherwise (within 1..16). The cost rule's k may
be 0 (a plain decoding step, with a one-token probe now and then) where drafting does not pay (`CostRule`).

`lookup`: the pass may also carry tokens copied from the context - what `pld` would propose (the last 1-3
tokens matched at their most recent earlier occurrence, the tokens after it copied; `ContextIndex.match`) for the
text the drafts lead to - after the draft's proposals, and where a copy of the settled context is likelier to pay
than drafting, the step verifies that copy alone with no draft pass. `Copies` chooses by expected tokens per second
of the step: the draft's acceptance rate from the cost rule's counts, each copied token's from this run's own copies
(`CopyRate`, per n-gram length), the step's seconds from the measured pass costs. Copies are proposals like the
draft's, with q one-hot on the copied token (a fixed proposal): greedy output stays `ar`'s and sampled output is
distributed as the target's. With `tree` the copy is grafted into the drafted tree as `eagle` does it
(speculative_tree.py). `lookup=0` is the draft alone (what `hf-assisted` does with the same draft).

Invariant between steps: `seq` is prompt + output; each cache holds a prefix of `seq` and the rest of `seq`
(at least its last token) is fed on the next pass.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from .. import verification
from ..engine import Engine, ModelError
from .base import Param, Request, RequestError, Run, Strategy, register
from .prompt_lookup import LOOKUP_NGRAM, ContextIndex, CopyRate

K_MIN, K_MAX = 1, 16
DECAY = 0.8               # "cost" rule: weight of the acceptance counts one step older
PRIOR = (1.0, 1.0)        # "cost" rule: (accepted, rejected) counts before the first step
COST_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 24, 33)   # target pass widths measured (the rest interpolated)
PROBE_EVERY = 8           # "cost" rule: after this many steps without drafts, one step drafts a token
TRAIN_DRAFT = "train it: python -m paradec train draft --model MODEL"


def _dtype_name(engine) -> str:
    return str(engine.dtype).replace("torch.", "")


def _load_draft(engine, path) -> Engine:
    """A draft folder: a distilled paradec draft (shares the target's embeddings) or an ordinary model folder."""
    from .. import draft as D
    if D.is_draft_dir(path):
        try:
            return D.load(path, engine).engine()
        except ValueError as e:
            raise ModelError(str(e)) from e
    return Engine.load(str(path), device=str(engine.device), dtype=_dtype_name(engine))


_LOAD_LOCK = threading.Lock()    # draft loads are not thread-safe in transformers: one at a time


class NoDraft(ModelError):
    """The model's profile names no draft, or the named draft folder is missing."""


def configure_drafts(engine, specs) -> dict[str, str]:
    """Restrict `engine` to the drafts an operator configured (`serve --draft NAME=PATH` or `--draft PATH`, the
    name then being the folder's name): afterwards a request's `draft` parameter may only name one of them, and
    the first is the default draft. Raises ModelError for a spec that is not a model folder. With no specs the
    engine still gets an empty allow-list: only its profile's own draft can be used."""
    choices: dict[str, str] = {}
    for spec in specs or []:
        name, sep, path = str(spec).partition("=")
        if not sep:
            name, path = Path(spec).name, spec
        name, path = name.strip(), path.strip()
        if not name or not ((Path(path) / "config.json").is_file() or (Path(path) / "draft_config.json").is_file()):
            raise ModelError(f"--draft {spec!r}: not a model folder (expected NAME=PATH or PATH with a config.json "
                             "or a paradec draft_config.json)")
        if name in choices:
            raise ModelError(f"--draft: the name {name!r} is given twice")
        choices[name] = str(Path(path).resolve())
    engine.extras["draft_choices"] = choices
    return choices


def preload_drafts(engine) -> None:
    """Load every configured draft (and the profile's default) now, and measure the pass costs the "cost" rule
    reads, before any request thread needs them."""
    drafts = [draft_model(engine, Request(params={"draft": name})) for name in engine.extras.get("draft_choices") or {}]
    try:
        drafts.append(draft_model(engine))
    except NoDraft:
        pass
    for d in drafts:
        pass_costs(engine, d)


def pass_costs(engine, draft) -> tuple[dict[int, float], float]:
    """(target pass costs at COST_WIDTHS, one draft pass's cost), measured once per engine (paradec/passcost.py)."""
    from .. import passcost
    return passcost.pass_costs(engine, COST_WIDTHS), passcost.pass_costs(draft, [1])[1]


def check_draft_name(engine, name: str) -> None:
    """RequestError unless `name` is '' or a draft this engine's operator configured (when it has an allow-list).
    The message names only the configured drafts, never a path."""
    choices = engine.extras.get("draft_choices")
    if choices is None or not name or name in choices:
        return
    offered = ", ".join(sorted(choices)) or "none besides the model's default"
    raise RequestError(f"sps: unknown draft {name[:64]!r}; this server offers: {offered}")


def draft_model(engine, request: Request | None = None) -> Engine:
    """The draft Engine for `engine`: request.params['draft'] if given, else the default draft: the first the
    operator configured (`configure_drafts`), else the one its model profile names (`engine.profile.draft`, e.g.
    paradec-tiny-draft for paradec-tiny). With an allow-list (the server) `draft` must be one of its names; in
    process (CLI, library) it may be a model path. The default one is loaded once and cached in
    engine.extras['draft'] (tests and callers may put any Engine there); drafts named by path are cached in
    engine.extras['drafts'][path]. Loads are serialised by one lock."""
    path = str((request.params.get("draft") if request is not None else None) or "")
    choices = engine.extras.get("draft_choices")
    if choices is not None and path:
        check_draft_name(engine, path)
        path = choices[path]
    if not path:
        if engine.extras.get("draft") is not None:
            return engine.extras["draft"]
        default = next(iter(choices.values()), None) if choices else None
        default = default or getattr(getattr(engine, "profile", None), "draft", None)
        if default is None or not any((Path(default) / f).exists() for f in ("config.json", "draft_config.json")):
            raise NoDraft(f"no draft model for {engine.name}: {TRAIN_DRAFT}")
        with _LOAD_LOCK:
            if engine.extras.get("draft") is None:
                engine.extras["draft"] = _load_draft(engine, default)
        return engine.extras["draft"]
    path = str(Path(path).expanduser().resolve()) if choices is None else path   # one cache entry per folder
    drafts = engine.extras.setdefault("drafts", {})
    with _LOAD_LOCK:
        if path not in drafts:
            drafts[path] = _load_draft(engine, path)
    return drafts[path]


def incompatibility(engine, draft) -> str:
    """'' when `draft` can draft for `engine` (same tokenizer vocabulary), else why not. Cached per pair."""
    memo = engine.extras.setdefault("draft_checks", {})
    key = id(draft)
    if key not in memo:
        why = ""
        if draft is not engine and draft.tokenizer.get_vocab() != engine.tokenizer.get_vocab():
            why = (f"the draft model {draft.name} has a different tokenizer from {engine.name}; "
                   "pass a draft with the same tokenizer (parameter draft=PATH)")
        memo[key] = why
    return memo[key]


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits (..., V_d) -> (..., vocab_size): padding rows the draft lacks get -inf (zero probability);
    extra draft rows (embedding padding beyond the tokenizer) are dropped."""
    v = logits.shape[-1]
    if v == vocab_size:
        return logits
    if v > vocab_size:
        return logits[..., :vocab_size]
    pad = torch.full((*logits.shape[:-1], vocab_size - v), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], -1)


def best_k(rate: float, target_cost, draft_cost: float, k_max: int = K_MAX, k_min: int = K_MIN) -> int:
    """The k in k_min..k_max with the most expected tokens per second when each proposal is accepted with
    probability `rate` (given the ones before it): (1 - rate^(k+1)) / (1 - rate) tokens from a step costing
    target_cost(k + 1) + k * draft_cost seconds (k = 0: a plain decoding step)."""
    best, best_k_ = -1.0, k_min
    for k in range(k_min, max(k_min, k_max) + 1):
        tokens = sum(rate ** i for i in range(k + 1))
        speed = tokens / (target_cost(k + 1) + k * draft_cost)
        if speed > best:
            best, best_k_ = speed, k
    return best_k_


class CostRule:
    """The "cost" rule: decayed counts of accepted and rejected proposals give the acceptance rate; `best_k`
    turns it into the next k with the pass costs measured on the target and on the draft. A draft pass's cost
    follows what the run's own drafting takes (a decayed mean of the seconds per drafted token, the Python
    around the pass included; steps that first catch the draft up on several tokens are not counted). k may be
    0, a plain decoding step, when no draft length pays: on a CPU a draft pass costs about a tenth of a target
    pass, so a draft accepted less than about one time in ten only slows decoding; after PROBE_EVERY such
    steps one step drafts a token, so the rate keeps up with the text."""

    def __init__(self, engine, draft=None, draft_cost: float | None = None):
        """`draft`: a draft Engine, its pass timed by paradec/passcost.py; or `draft_cost`, a draft step's
        seconds measured by the caller (a draft that is not an Engine: eagle's)."""
        from .. import passcost
        if draft is not None:
            tc, self.draft_cost = pass_costs(engine, draft)
        else:
            tc, self.draft_cost = passcost.pass_costs(engine, COST_WIDTHS), float(draft_cost)
        self.target_cost = lambda w: passcost.cost_at(tc, w)
        self.accepted, self.rejected = PRIOR
        self.idle = 0

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def next_k(self, drafted: int, accepted: int, draft_seconds: float | None = None) -> int:
        """k for the next step after one that drafted `drafted` tokens (taking `draft_seconds` to draft them, or
        None when not to be counted) of which the target accepted `accepted`."""
        if drafted:
            self.accepted = DECAY * self.accepted + accepted
            self.rejected = DECAY * self.rejected + (accepted < drafted)
            if draft_seconds is not None:
                self.draft_cost = DECAY * self.draft_cost + (1 - DECAY) * draft_seconds / drafted
        k = best_k(self.rate, self.target_cost, self.draft_cost, k_min=0)
        self.idle = self.idle + 1 if k == 0 else 0
        if self.idle > PROBE_EVERY:
            self.idle, k = 0, 1
        return k


class Copies:
    """`lookup` for the chain: tokens copied from the context as proposals (the module's docstring). A step's value is
    its expected tokens per modelled second: k drafted tokens accepted in turn at the draft's running rate `a`
    (1 + a + .. + a^k expected), a copy after them reached with probability a^k and its j-th token held with the
    probability `CopyRate` gives it, over the target pass's measured cost at its width plus k draft passes."""

    def __init__(self, ids, most: int, target_cost):
        self.most, self.target_cost = most, target_cost
        self.index = ContextIndex(LOOKUP_NGRAM)
        self.index.extend(ids)
        self.rates = CopyRate()

    def _best(self, k: int, rate: float, probs: list[float], draft_cost: float) -> tuple[float, int]:
        """(value, j): the most expected tokens per second of a step with k drafted tokens and the first j copied."""
        expected = sum(rate ** i for i in range(k + 1))
        reach, spent = rate ** k, k * draft_cost
        best, j, held = (expected / (self.target_cost(k + 1) + spent), 0), 0, 0.0
        for j, q in enumerate(probs, 1):
            held += q
            value = (expected + reach * held) / (self.target_cost(k + 1 + j) + spent)
            if value > best[0]:
                best = (value, j)
        return best

    def alone(self, k: int, left: int, rate: float, draft_cost: float) -> tuple[list[int], int]:
        """Before drafting k tokens: the copy of the settled context to verify instead, with no draft pass, when it
        is worth more than the k drafts (else ([], 0)), and the n-gram length it was copied after."""
        copy, ngram = self.index.match(min(self.most, left)) if k and left > 0 else ([], 0)
        if not copy:
            return [], 0
        value, j = self._best(0, rate, self.rates.probs(ngram, len(copy)), draft_cost)
        if j and value >= self._best(k, rate, [], draft_cost)[0]:
            return copy[:j], ngram
        return [], 0

    def after(self, proposals: list[int], left: int, rate: float, draft_cost: float) -> tuple[list[int], int]:
        """The copied tokens to verify after the drafted `proposals` (as many as pay; `left`: budget tokens the
        proposals leave) and the n-gram length they were copied after."""
        room = min(self.most, left)
        copy, ngram = self.index.match(room, tail=proposals) if room > 0 else ([], 0)
        if not copy:
            return [], 0
        _value, j = self._best(len(proposals), rate, self.rates.probs(ngram, len(copy)), draft_cost)
        return copy[:j], (ngram if j else 0)

    def settled(self, tokens: list[int], drafted: int, copied: int, ngram: int, accepted: int) -> None:
        """After a step whose `drafted` drafted then `copied` copied proposals had `accepted` accepted: `tokens`
        joined the context; a copied token counts as tried when every proposal before it held."""
        self.index.extend(tokens)
        if copied and accepted >= drafted:
            self.rates.record(ngram, min(copied, accepted - drafted + 1), accepted - drafted)


def one_hot(tokens: list[int], width: int, like: torch.Tensor) -> list[torch.Tensor]:
    """The proposal distributions q of fixed (copied) tokens: one-hot rows of `width` (rejection sampling accepts
    such a token with probability p(token) and otherwise draws from p with the token removed: exact)."""
    rows = torch.zeros(len(tokens), width, dtype=torch.float32, device=like.device)
    if tokens:
        rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return list(rows)


def draft_step(out, v, drafted: int, prefill: bool, draft_s: float = 0.0, copied: int | None = None):
    """The Step of one draft-and-verify step: one target pass, `drafted` draft passes and proposals (then `copied`
    copied ones, with `lookup`), the verdict's tokens (cut by the output's stopping rules) and how many proposals
    were kept; info["draft_s"]: the seconds spent drafting (the draft's share of the step time, for
    `evals/sps_tune.py`)."""
    info = {"k": drafted, "draft_s": draft_s} | ({"copied": copied} if copied is not None else {})
    step = out.step(v.tokens, forward_passes=1, draft_passes=drafted, drafted=drafted + (copied or 0),
                    prefill=prefill, info=info)
    step.accepted = min(v.accepted, len(step.token_ids))
    return step


def tree_params(depth: int = 6, branch: int = 3, width: int = 3, nodes: int = 12, stop: float = 0.4) -> dict:
    """The parameters of a drafted tree (`sps` and `eagle` with tree=true), with these defaults."""
    return {
        "depth": Param(depth, int, 1, 16, help="tree: levels drafted at most (one draft pass each)"),
        "branch": Param(branch, int, 1, 16, help="tree: children drafted under each expanded node"),
        "width": Param(width, int, 1, 16, help="tree: nodes of the newest level expanded per draft pass"),
        "nodes": Param(nodes, int, 1, 64, help="tree: nodes the target verifies at most (fewer when wider passes "
                                               "do not pay by the measured pass costs)"),
        "stop": Param(stop, float, 0.0, 1.0, help="tree: stop drafting once the nodes to expand hold less than "
                                                   "this much of the draft's probability"),
    }


@register
class SpeculativeSampling(Strategy):
    name = "sps"
    title = "Speculative decoding (draft model)"
    lossless = True
    params = {
        "k": Param(4, int, K_MIN, K_MAX, help="tokens drafted per step (the start value when adaptive)"),
        "adaptive": Param(True, bool, help="change k after every step by `rule`"),
        "rule": Param("cost", str, choices=("cost", "transformers"),
                      help="cost: the k with the most expected tokens/s from the running acceptance rate and "
                           "measured pass costs; transformers: +2 after a fully accepted step, -1 otherwise"),
        "draft": Param("", str, help="draft model with the same tokenizer: on a server, the name of one its operator "
                                     "configured (serve --draft); in process, a model folder (default: the model "
                                     "profile's draft)"),
        "lookup": Param(16, int, 0, 32, help="also verify up to this many tokens copied from the context (what pld "
                                             "proposes; chain: for the text the drafts lead to, or a copy alone "
                                             "with no draft pass where it pays more; tree: grafted in, as eagle's), "
                                             "as many as pay by the measured pass costs; 0 = the draft alone"),
        "tree": Param(False, bool, help="draft a tree of the draft's likeliest tokens and verify its likeliest "
                                        "nodes in one tree-masked pass (speculative_tree.py; adaptive: draft only "
                                        "while it pays) instead of a chain of k"),
        **tree_params(),
    }

    def resolve_params(self, request: Request, engine=None) -> dict:
        p = super().resolve_params(request, engine)
        if engine is not None:
            check_draft_name(engine, p["draft"])
        return p

    def available(self, engine) -> tuple[bool, str]:
        try:
            draft = draft_model(engine)
        except NoDraft:
            return False, TRAIN_DRAFT
        except ModelError as e:
            return False, str(e)
        why = incompatibility(engine, draft)
        return (not why), why

    def steps(self, run: Run):
        engine, request, p, out, tcache = run.engine, run.request, run.params, run.out, run.cache
        draft = draft_model(engine, request)
        why = incompatibility(engine, draft)
        if why:
            raise ModelError(why)
        if p["tree"]:
            from .speculative_tree import tree_steps
            yield from tree_steps(run, draft)
            return
        sp = request.sampling
        rng = verification.Rng(request.seed)
        seq = list(run.ids)
        dcache = draft.new_cache()
        k, prefill = p["k"], True
        rule = CostRule(engine, draft) if p["adaptive"] and p["rule"] == "cost" else None
        # `lookup`: the draft's running acceptance rate and pass costs (the cost rule's, kept even where k is not
        # chosen by it) price the copies
        counts = rule or (CostRule(engine, draft) if p["lookup"] else None)
        copies = Copies(seq, p["lookup"], counts.target_cost) if p["lookup"] else None
        while True:
            left = out.budget - len(out.ids) - 1           # the last budget token comes free
            kk = max(0, min(k, left))
            copy, ngram = copies.alone(kk, left, counts.rate, counts.draft_cost) if copies else ([], 0)
            kk = 0 if copy else kk
            proposals, qs = [], []
            feed = seq[draft.cache_len(dcache):]
            caught_up, t0 = len(feed) <= 2, time.perf_counter()    # one or two tokens: an ordinary step
            for _ in range(kk):
                lg = fit_vocab(draft.forward(feed, dcache, logits_to_keep=1, upcast=False)[0, -1], engine.vocab_size)
                x = verification.draft_pick(lg, sp, rng, qs)
                proposals.append(x)
                feed = [x]
            spent = time.perf_counter() - t0
            draft_seconds = spent if caught_up else None
            if copies is not None and not copy:
                copy, ngram = copies.after(proposals, left - kk, counts.rate, counts.draft_cost)
            base = len(seq)
            logits = engine.forward(seq[engine.cache_len(tcache):] + proposals + copy, tcache,
                                    logits_to_keep=kk + len(copy) + 1, upcast=False)[0]
            if copy and not sp.greedy:
                qs += one_hot(copy, logits.shape[-1], logits)
            v = verification.draft_verdict(proposals + copy, qs, logits, sp, rng)
            engine.crop(tcache, base + v.accepted)
            draft.crop(dcache, base + v.accepted)      # a no-op when it holds less
            seq += v.tokens
            if copies is not None:
                copies.settled(v.tokens, kk, len(copy), ngram, v.accepted)
            yield draft_step(out, v, kk, prefill, spent, len(copy) if copies is not None else None)
            if out.done:
                return
            prefill = False
            held = min(v.accepted, kk)                     # the drafted proposals accepted (copies after them)
            if counts is not None:
                nk = counts.next_k(kk, held, draft_seconds)
                k = nk if rule is not None else k
            if rule is None and p["adaptive"] and kk:
                k = min(K_MAX, k + 2) if held == kk else max(K_MIN, k - 1)
