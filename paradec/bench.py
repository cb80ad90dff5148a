"""Benchmark mode: per prompt, strategies one after another, warm-up, fixed seeds, N repeats.

Every result is written to the store as soon as it exists (its own transaction), so a run killed at any
point keeps what it finished and `resume` completes it without duplicate rows. Quality is measured
against `ar`'s output for the same prompt and repeat (exact token match, ROUGE-L, BLEU) and against the
reference where the eval item has one; perplexity of every output under the target model. `result_row` turns a
finished lane into its stored row (the Arena and the long-context eval store theirs through it too), and `table`
is the one summary and speed-up table, whose Markdown bench prints.
"""
from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from . import quality
from .metrics import by_category, speedup, summary
from .race import run_alone
from .strategies import Request, get


@dataclass
class BenchItem:
    item_id: str
    category: str
    turns: list[str]
    reference: str | None = None
    chat: bool = True
    references: list | None = None     # one per turn
    tests: str | None = None           # Python checks of a code item's answer (the suite's `tests` field)

    def reference_for(self, turn: int) -> str | None:
        if self.references and turn < len(self.references):
            return self.references[turn]
        return self.reference if len(self.turns) == 1 else None


@dataclass
class BenchSettings:
    strategies: list[str]
    repeats: int = 1
    max_new_tokens: int = 96
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    warmup: bool = True
    ignore_eos: bool = False
    params: dict = field(default_factory=dict)    # strategy -> {param: value}
    perplexity: bool = True
    peers: dict = field(default_factory=dict)     # lane name -> "STRATEGY@URL": another engine's lane in this run
    max_context: int = 0                          # the requests' context window (0 = the model's own)


class PeerError(ValueError):
    """A --peer spec that cannot be used."""


def parse_peer(spec: str) -> tuple[str, str, str]:
    """'NAME=STRATEGY@URL' (or 'NAME=URL', strategy ar) -> (name, strategy, url). A peer is a lane of the run
    served by another engine - an OpenAI-compatible server (vLLM plain: ar; vLLM with its n-gram speculation:
    vllm-spec; paradec serve: any strategy) - timed client-side like every remote run, on the same prompts."""
    name, eq, rest = str(spec).partition("=")
    rest = rest.strip()
    # a bare URL may hold an '@' of its own (user@host): only a STRATEGY@ in front of the URL names a strategy
    strategy, _, url = ("ar", "", rest) if rest.startswith(("http://", "https://")) else rest.partition("@")
    name, strategy, url = name.strip(), strategy.strip(), url.strip()
    if not eq or not re.fullmatch(r"[A-Za-z][\w.-]{0,39}", name or "") or not url.startswith(("http://", "https://")):
        raise PeerError(f"--peer {spec!r}: expected NAME=STRATEGY@URL, e.g. vllm=ar@http://127.0.0.1:8011 or "
                        "vllm-ngram=vllm-spec@http://127.0.0.1:8012")
    if not re.fullmatch(r"[a-z][\w-]{0,39}", strategy):
        raise PeerError(f"--peer {spec!r}: {strategy!r} is not a strategy name")
    return name, strategy, url


def peer_engines(settings: BenchSettings) -> dict:
    """{lane name: (RemoteEngine, strategy)} for the run's peers."""
    from .remote import RemoteEngine
    out = {}
    for name, spec in (settings.peers or {}).items():
        _, strategy, url = parse_peer(f"{name}={spec}")
        out[name] = (RemoteEngine(url), strategy)
    return out


def _lossless(name: str) -> bool:
    """A strategy's lossless flag, remote-only names (`vllm-spec`) included: one answer for every path."""
    from .remote import RemoteEngine
    return RemoteEngine.lossless(name)


def environment(engine, settings: BenchSettings, roofline: dict | None = None) -> dict:
    """The run's environment; `roofline` is the read-bandwidth probe (`roofline.probe`) taken at its start."""
    import sqlalchemy
    env = engine.describe()
    env.update(python=platform.python_version(), machine=platform.machine(), processor=platform.processor(),
               sqlalchemy=sqlalchemy.__version__, settings=asdict(settings))
    if roofline:
        env["roofline"] = roofline
    return env


def items_from_store(store, eval_set_id: int) -> list[BenchItem]:
    return [BenchItem(str(i["item_id"]), i["category"] or "general", list(i["turns"]), i.get("reference"),
                      i.get("chat") is not False, i.get("references"), _tests(i.get("meta")))
            for i in store.get_eval_set_items(eval_set_id)]


def _tests(meta) -> str | None:
    t = (meta or {}).get("tests")
    return t if isinstance(t, str) and t.strip() else None


def items_from_evalset(es) -> list[BenchItem]:
    return [BenchItem(str(it.item_id), it.category, list(it.turns), it.reference, it.chat, it.references,
                      _tests(it.meta)) for it in es.items]


class ResumeError(ValueError):
    """A run cannot be resumed; the message says why."""


def resume_plan(store, run: dict) -> tuple[BenchSettings, list[BenchItem]]:
    """The settings and items to resume a stored benchmark run with, whoever made it: `bench` (its eval set is
    stored: `eval_set_id`) or the Eval sets tab (`settings.source`: 'suite:NAME' or 'set:ID'); `settings.limit`
    cuts the items as the run did. Raises ResumeError for a race run or a run that says too little."""
    from dataclasses import fields

    from .evalsets import EvalSetError, load_suite
    st = run.get("settings") or {}
    raw = st.get("bench") if isinstance(st, dict) else None
    if run.get("kind") not in ("bench", "eval") or not isinstance(raw, dict):
        raise ResumeError(f"run {run.get('id')} is a {run.get('kind')} run, not a benchmark; only runs of "
                          "`bench` or of the Eval sets tab can be resumed")
    known = {f.name for f in fields(BenchSettings)}
    try:
        settings = BenchSettings(**{k: v for k, v in raw.items() if k in known})
    except TypeError as e:
        raise ResumeError(f"run {run.get('id')} cannot be resumed: its settings are incomplete ({e})") from None
    kind, _, key = str(st.get("source") or "").partition(":")
    if run.get("eval_set_id"):
        items = items_from_store(store, run["eval_set_id"])
    elif kind == "suite":
        try:
            items = items_from_evalset(load_suite(key))
        except EvalSetError as e:
            raise ResumeError(f"run {run.get('id')} cannot be resumed: {e}") from None
    elif kind == "set" and key.isdigit() and store.get_eval_set(int(key)) is not None:
        items = items_from_store(store, int(key))
    else:
        raise ResumeError(f"run {run.get('id')} cannot be resumed: it does not say which eval set it ran, or "
                          "that set has been deleted")
    limit = st.get("limit") or 0
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else 0
    return settings, items[:limit] if limit else items


def too_long(engine, items: list[BenchItem], max_new_tokens: int, strategies: list[str], limit: int = 10,
             max_context: int = 0) -> list[str]:
    """Items that cannot fit the context (the model's, or the `max_context` window) as the run would send them:
    the chat-templated conversation up to each turn (earlier answers counted at max_new_tokens each) plus
    max_new_tokens. [] when every item fits, or when a strategy of the run reads long prompts itself (pcw,
    focus) or the engine is remote."""
    from .strategies import length_check_engine
    from .strategies.base import window_phrase
    eng = length_check_engine(engine, list(strategies))
    if eng is None:
        return []
    out = []
    for it in items:
        msgs: list[dict] = []
        for t, text in enumerate(it.turns):
            msgs.append({"role": "user", "content": text})
            req = Request(prompt=text, messages=list(msgs) if len(it.turns) > 1 else None, chat=it.chat)
            n = len(eng.encode(req)) + (t + 1) * max_new_tokens
            C = min(eng.context_length, max_context) if max_context else eng.context_length
            if n > C:
                out.append(f"item {it.item_id} (turn {t + 1}): {n - (t + 1) * max_new_tokens} prompt tokens with "
                           f"the chat template + {(t + 1) * max_new_tokens} new > {window_phrase(eng, C)}")
                break
            msgs.append({"role": "assistant", "content": ""})
        if len(out) >= limit:
            break
    return out


def check_params(strategies: list[str], params) -> dict:
    """{strategy: {param: value}} checked before a benchmark starts: an object of objects, for strategies of
    the run, with known parameters of valid values. Raises RequestError."""
    from .strategies import RequestError
    if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
        raise RequestError('params must be a JSON object like {"pld": {"max_ngram": 3}}')
    extra = sorted(set(params) - set(strategies))
    if extra:
        raise RequestError(f"params given for strategies not in the run: {', '.join(extra)}")
    for name, given in params.items():
        get(name).resolve_params(Request(prompt="", params=dict(given)))
    return params


def effective_params(name: str, given: dict | None) -> dict:
    """The parameters a strategy runs with: its defaults, overridden by `given` (stored with every result, so a
    sweep over one parameter can be charted). A strategy not registered here (a remote server's own) keeps
    `given` as it is."""
    from .strategies import RequestError
    try:
        return get(name).resolve_params(Request(prompt="", params=dict(given or {})))
    except (RequestError, TypeError, ValueError):
        return dict(given or {})


def _ordered(strategies: list[str]) -> list[str]:
    """`ar` first: every other strategy's quality and losslessness is measured against its output."""
    s = [x for x in strategies if x != "ar"]
    return ["ar"] + s


def run_bench(engine, store, run_id: int, items: list[BenchItem], settings: BenchSettings,
              progress: Callable[[int, int, str], None] | None = None, should_stop: Callable[[], bool] | None = None,
              resume: bool = False) -> dict:
    """Run (or resume) a benchmark; returns counts. Rows already in the store are skipped."""
    strategies = _ordered(settings.strategies)
    done = store.done_keys(run_id) if resume else set()
    total = len(items) * len(strategies) * settings.repeats
    count = 0
    peers = peer_engines(settings)
    if settings.warmup and items:
        warm = Request(prompt=items[0].turns[0], chat=items[0].chat, max_new_tokens=8)
        for s in strategies:
            eng, strat = peers.get(s, (engine, s))     # a peer's server is warmed like an in-process lane
            run_alone(eng, strat, warm, settings.params.get(s))
    params = {s: effective_params(s, settings.params.get(s)) for s in strategies}
    stored = skipped = 0
    for item in items:
        ar_outputs: dict[tuple[int, int], tuple[list[int], str]] = {}
        for rep in range(settings.repeats):
            for s in strategies:
                history: list[dict] = []
                for turn, user_text in enumerate(item.turns):
                    if should_stop and should_stop():
                        return {"stored": stored, "skipped": skipped, "stopped": True, "total": total}
                    key = (item.item_id, s, rep, turn)
                    history.append({"role": "user", "content": user_text})
                    req = Request(prompt=user_text, messages=list(history) if len(item.turns) > 1 else None,
                                  chat=item.chat, max_new_tokens=settings.max_new_tokens,
                                  temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                                  seed=settings.seed + rep, ignore_eos=settings.ignore_eos,
                                  max_context=settings.max_context)
                    if key in done:
                        prev = store.get_result(run_id, *key)
                        skipped += 1
                        if s == "ar" and prev:
                            ar_outputs[(rep, turn)] = (prev["token_ids"] or [], prev["text"] or "")
                        history.append({"role": "assistant", "content": (prev or {}).get("text") or ""})
                        count += 1
                        continue
                    eng, strat = peers.get(s, (engine, s))
                    lane = run_alone(eng, strat, req, settings.params.get(s))
                    row = result_row(lane, req, item_key=item.item_id, category=item.category, strategy=s,
                                     repeat=rep, turn=turn, ar=ar_outputs.get((rep, turn)),
                                     reference=item.reference_for(turn), engine=eng,
                                     perplexity=settings.perplexity, peer=s in peers, params=params[s],
                                     scores=code_scores(item, lane))
                    if s == "ar":
                        ar_outputs[(rep, turn)] = (lane.token_ids, lane.text)
                    store.add_result(run_id, **row)
                    stored += 1
                    count += 1
                    history.append({"role": "assistant", "content": lane.text})
                    if progress:
                        progress(count, total, f"{item.item_id} · {s} · repeat {rep + 1}")
    return {"stored": stored, "skipped": skipped, "stopped": False, "total": total}


def code_scores(item: BenchItem, lane) -> dict | None:
    """Whether a code item's answer parses and passes the item's checks (`quality.code_checks`); None for other
    items and for failed lanes."""
    if lane.error or not (item.tests or item.category in quality.CODE_CATEGORIES):
        return None
    return quality.code_checks(lane.text, item.tests if len(item.turns) == 1 else None)


LANE_FACTS = ("route", "p_list", "points", "fallback",   # what SoT and SoT-R say about how they answered
              "plan")                                    # ptp: the (k, branches) it chose from measured pass costs


def result_row(lane, request: Request, *, item_key, category: str, strategy: str | None = None, repeat: int = 0,
               turn: int = 0, ar: tuple[list[int], str] | None = None, reference=None, engine=None,
               perplexity: bool = False, peer: bool = False, params: dict | None = None, meta: dict | None = None,
               scores: dict | None = None) -> dict:
    """The stored result row (`Store.add_result`'s fields) of a finished lane: the one path from a lane to a
    row, for bench, the Arena and the long-context eval.

    ar: (token ids, text) of ar's answer to the same request (the same prompt, repeat and turn), compared
    with unless the lane is ar's own; reference: the item's reference answer (one text or alternatives);
    engine: the engine the lane ran on (a remote one's token ids are placeholders, so only text is compared,
    and perplexity is taken only in process, when `perplexity` is set); peer: the lane is another engine's
    (its agreement with ar is information, never a lossless mismatch); scores: a task's own scores (e.g. the
    long-context eval's `correct`). The quality dict is `paradec.quality`'s schema plus lossless_strategy,
    status, finish_reason, perplexity and the scores; meta is what the strategy reported about its answer
    (LANE_FACTS) plus `meta`."""
    f = lane.figures()
    strategy = strategy or lane.name
    remote = getattr(engine, "remote", False)
    q: dict = {"lossless_strategy": lane.lossless and not peer, "status": lane.status,
               "finish_reason": lane.finish_reason}
    if not lane.error:
        compare = ar is not None and strategy != "ar"
        q.update(quality.quality_row(lane.text, lane.token_ids, ar_text=ar[1] if compare else None,
                                     ar_ids=ar[0] if compare else None, reference=reference or None,
                                     text_only=remote))
        if perplexity and lane.token_ids and engine is not None and not remote:
            q["perplexity"] = quality.perplexity(engine, engine.encode(request), lane.token_ids)
        if q["lossless_strategy"] and q.get("exact_match") is False and engine is not None and not remote:
            q["divergence"] = quality.divergence_margin(engine, engine.encode(request), ar[0], lane.token_ids,
                                                        q.get("diverges_at"))
    q.update(scores or {})
    facts = {k: lane.info[k] for k in LANE_FACTS if k in lane.info} | (meta or {})
    return dict(item_key=str(item_key), category=category, strategy=strategy, repeat=repeat, turn=turn,
                prompt=request.prompt, text=lane.text, token_ids=lane.token_ids, n_tokens=f.tokens,
                forward_passes=f.forward_passes, draft_passes=f.draft_passes, drafted=f.drafted,
                accepted=f.accepted, ttft_s=f.ttft_s, e2e_s=f.elapsed_s, tokens_per_s=f.tokens_per_s,
                tpot_s=f.tpot_s, tokens_per_pass=f.tokens_per_pass, itl=f.itl, error=lane.error, params=params,
                meta=facts or None, quality=q)


# ---------------------------------------------------------------- tables

def table(df) -> list[dict]:
    """Per run, category (and 'all', by `metrics.by_category`'s rule) and strategy: speed-up vs ar, tau,
    TTFT/TPOT p50, quality, mismatches, n. The one speed-up table: bench's Markdown, the CLI, the Dashboard's
    summary and speed-up charts (`charts.speedup_table`) and the Eval sets tab read it. A column the frame
    lacks (a hand-made frame) counts as no values."""
    rows = []
    if df is None or len(df) == 0:
        return rows
    df = df[df["error"].isna()] if "error" in df else df

    def col(d, name) -> list:
        return d[name].tolist() if name in d else []
    for run_id, cat, d in by_category(df):
        ar = d[d["strategy"] == "ar"]
        for s in sorted(d["strategy"].unique(), key=lambda x: (x != "ar", x)):
            ds = d[d["strategy"] == s]
            qual = col(ds, "quality")
            mism = [q for q in qual if q and q.get("lossless_strategy") and q.get("exact_match") is False]
            rl = [q.get("rouge_l_vs_ar") for q in qual if q and q.get("rouge_l_vs_ar") is not None]
            rr = [q.get("rouge_l_vs_ref") for q in qual if q and q.get("rouge_l_vs_ref") is not None]
            ppl = [q.get("perplexity") for q in qual if q and q.get("perplexity") is not None]
            parses = [bool(q["code_parses"]) for q in qual if q and q.get("code_parses") is not None]
            passes = [bool(q["passes_tests"]) for q in qual if q and q.get("passes_tests") is not None]
            rows.append({
                "run": int(run_id), "category": cat, "strategy": s, "n": len(ds),
                "tokens_per_s": summary(col(ds, "tokens_per_s"))["mean"],
                "speedup": speedup(col(ds, "tokens_per_s"), col(ar, "tokens_per_s")),
                "e2e_speedup": speedup(col(ar, "e2e_s"), col(ds, "e2e_s")),  # mean ar E2E / mean E2E
                "forward_passes": summary(col(ds, "forward_passes"))["mean"],
                "tokens_per_pass": summary(col(ds, "tokens_per_pass"))["mean"],
                "ttft_p50": summary(col(ds, "ttft_s"))["p50"],
                "tpot_p50": summary(col(ds, "tpot_s"))["p50"],
                "rouge_l_vs_ar": sum(rl) / len(rl) if rl else None,
                "rouge_l_vs_ref": sum(rr) / len(rr) if rr else None,
                "perplexity": sum(ppl) / len(ppl) if ppl else None,
                "code_parses": sum(parses) / len(parses) if parses else None,
                "passes_tests": sum(passes) / len(passes) if passes else None,
                "lossless_mismatches": len(mism) if _lossless(s) and s != "ar" else None,
            })
    return rows


def _cell(v) -> str:
    """Text for one Markdown table cell: a `|` or a line break in a category or name cannot break the table."""
    return " ".join(str(v).split()).replace("\\", "\\\\").replace("|", "\\|")


def markdown(rows: list[dict], title: str = "") -> str:
    def f(v, fmt):
        return "–" if v is None or v != v else format(v, fmt)
    head = ("| category | strategy | speed-up vs ar | end-to-end speed-up | tokens/s | tokens/pass | TTFT p50 (s) | TPOT p50 (ms) | "
            "ROUGE-L vs ar | ROUGE-L vs ref | perplexity | lossless mismatches | n |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {_cell(r['category'])} | {_cell(r['strategy'])} | {f(r['speedup'], '.2f')}× | {f(r['e2e_speedup'], '.2f')}× | "
        f"{f(r['tokens_per_s'], '.1f')} | "
        f"{f(r['tokens_per_pass'], '.2f')} | {f(r['ttft_p50'], '.3f')} | "
        f"{f(None if r['tpot_p50'] is None else r['tpot_p50'] * 1000, '.1f')} | {f(r['rouge_l_vs_ar'], '.3f')} | "
        f"{f(r['rouge_l_vs_ref'], '.3f')} | {f(r['perplexity'], '.2f')} | "
        f"{'–' if r['lossless_mismatches'] is None else r['lossless_mismatches']} | {r['n']} |\n"
        for r in rows)
    return (f"{title}\n\n" if title else "") + head + body


def mismatch_lines(df) -> str:
    """One Markdown bullet per lossless mismatch of a results frame: strategy, item, the first differing token
    and how close the model's choice was there (`quality.divergence_margin`), so a reader can tell rounding at
    a near-tie from a disagreement. Empty when there is none."""
    out = []
    if df is None or len(df) == 0 or "quality" not in df:
        return ""
    for _, r in df.iterrows():
        q = r["quality"] or {}
        if not (q.get("lossless_strategy") and q.get("exact_match") is False):
            continue
        d = q.get("divergence") or {}
        where = f"token {q.get('diverges_at')}"
        how = (f": logit margin {d['logit_margin']:.3f} (p {d['p_ar']:.3f} for ar's token, {d['p_other']:.3f} for "
               f"{_cell(r['strategy'])}'s)") if d else ""
        out.append(f"- {_cell(r['strategy'])}, item {_cell(r['item_key'])} (turn {r.get('turn', 0)}): first differs at "
                   f"{where}{how}")
    if not out:
        return ""
    return "Lossless mismatches (where greedy output first differs from ar's, and the model's margin there):\n\n" \
        + "\n".join(out) + "\n"


def _prompt_tokens(engine, item: BenchItem | None, row, ar_texts: dict) -> int:
    """Tokens of the context ar's result was decoded after: the prompt, with earlier turns and ar's answers."""
    chat = item.chat if item is not None else True
    if item is not None and len(item.turns) > 1:
        msgs: list[dict] = []
        for k in range(int(row["turn"])):
            msgs += [{"role": "user", "content": item.turns[k]},
                     {"role": "assistant", "content": ar_texts.get((row["item_key"], row["repeat"], k), "")}]
        msgs.append({"role": "user", "content": row["prompt"] or ""})
        return len(engine.encode(Request(prompt=row["prompt"] or "", messages=msgs, chat=chat)))
    return len(engine.encode(Request(prompt=row["prompt"] or "", chat=chat)))


def roofline_summary(rf: dict | None, df, engine=None, items: list[BenchItem] | None = None) -> dict | None:
    """ar's decode rate (1 / TPOT p50) and E2E rate (mean tokens/s) against the read-bandwidth roofline that
    the run stored in its environment (`rf`, from `roofline.probe`). The KV-cache reads are counted at ar's
    mean context (prompt tokens + n/2, over ar's results) when the engine can count prompt tokens."""
    from . import roofline as R
    if not rf or not rf.get("bandwidth_gbs") or df is None or len(df) == 0:
        return None
    d = df[df["strategy"] == "ar"]
    if "error" in d:
        d = d[d["error"].isna()]
    tpot = [t for t in d["tpot_s"].tolist() if t is not None and t == t and t > 0]
    p50 = summary(tpot)["p50"]
    decode = 1.0 / p50 if p50 else None
    e2e = summary([v for v in d["tokens_per_s"].tolist() if v is not None and v == v])["mean"]
    ctx = None
    if engine is not None and not getattr(engine, "remote", False) and len(d):
        by_id = {it.item_id: it for it in items or []}
        ar_texts = {(r["item_key"], r["repeat"], r["turn"]): r.get("text") or "" for _, r in d.iterrows()}
        ctxs = [R.mean_context(_prompt_tokens(engine, by_id.get(r["item_key"]), r, ar_texts), int(r["n_tokens"]))
                for _, r in d.iterrows()]
        ctx = sum(ctxs) / len(ctxs)
    kv = rf.get("kv_bytes_per_context_token", 0) * ctx if ctx is not None else 0.0
    out = R.roofline(rf["bandwidth_gbs"], rf["weight_bytes_per_token"], kv, decode, e2e)
    out.update(mean_context=ctx, kv_included=ctx is not None, n=len(d))
    return out


def roofline_line(r: dict | None) -> str:
    """'ar at 71% of the 8.4 tok/s read-bandwidth roofline (16.9 GB/s, 2.01 GB/token …) …'."""
    from . import roofline as R
    return R.line(r) if r else "roofline: not measured"


def race_vs_alone(engine, request: Request, strategies: list[str], repeats: int = 3,
                  params: dict | None = None) -> list[dict]:
    """Race the strategies together, then run each alone, `repeats` times each, alternating; compare tokens/s.

    The race runner times every step by itself, so a strategy's race figures should match its benchmark-mode
    figures; this prints how closely they do on this machine.
    """
    from .race import Race
    race_tps: dict[str, list[float]] = {s: [] for s in strategies}
    alone_tps: dict[str, list[float]] = {s: [] for s in strategies}
    params = params or {}         # {strategy: its parameters}
    for s in strategies:          # warm-up
        run_alone(engine, s, replace(request, max_new_tokens=8), params.get(s))
    for _ in range(repeats):
        lanes = Race(engine, request, strategies, params).run()
        for s in strategies:
            race_tps[s].append(lanes[s].figures().tokens_per_s or 0.0)
            alone_tps[s].append(run_alone(engine, s, request, params.get(s)).figures().tokens_per_s or 0.0)
    rows = []
    for s in strategies:
        r, a = summary(race_tps[s])["mean"], summary(alone_tps[s])["mean"]
        rows.append({"strategy": s, "race_tokens_per_s": r, "alone_tokens_per_s": a, "ratio": r / a if a else None,
                     "n": repeats})
    return rows
