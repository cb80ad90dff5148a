"""The Arena tab: one prompt, several strategies racing on one engine, one live column each.

The race itself is `paradec.race.Race` (a worker thread that advances the lanes step by step, each on its own
compute clock). The event handler here only reads its events and snapshots and turns them into HTML about
15 times a second. Saving the run does not depend on the handler: a small thread waits for the race to end
(finished or stopped) and writes it to the store, so a cancelled handler or a closed page still saves.
"""
from __future__ import annotations

import html
import json
import queue
import threading
import time

import gradio as gr

from ..bench import BenchSettings, environment, result_row
from ..metrics import figures as step_figures, speedup
from ..quality import first_divergence
from ..race import Race
from ..strategies import REGISTRY, Request, RequestError, get, length_check_engine, load_all
from . import charts

MAX_COLUMNS = 8
FRAME_S = 1 / 15            # at most ~15 updates a second
CHART_S = 0.5               # the live chart is redrawn at most twice a second
SHADES = ("#cfe3ff", "#ffe2b8")   # alternate backgrounds of multi-token groups
DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


# a short "what it does" per strategy, shown beside its checkbox
HINTS = {
    "ar": "one token per forward pass: the baseline every column is compared with",
    "sps": "a small draft model proposes tokens, the target checks them in one pass",
    "eagle": "a one-layer draft reads the target's own hidden states and drafts a tree of tokens; one pass checks "
             "its likeliest branches",
    "pld": "copies n-grams from the prompt and checks them in one pass",
    "lookahead": "Jacobi iterations guess n-grams, checked in the same pass",
    "ptp": "a trained drafter predicts a block of tokens at once",
    "sot": "a skeleton first, then all points written in one batch",
    "sot-seq": "SoT's baseline: the same points written one after another",
    "sot-r": "SoT for list-style questions only (a router), ar otherwise",
    "lud": "trained pad slots guess the next tokens; confident ones are kept",
    "lud-verified": "lud's pad-slot guesses and copies from the context become drafts the next pass checks: ar's "
                    "text, fewer passes",
    "pcw": "a long prompt as parallel context windows",
    "ape": "parallel context windows with APE's shared prefix, temperature and scaling",
    "focus": "a long prompt as a batch of chunks with trained candidate tokens",
    "hf-generate": "transformers' own generate: the peer of ar",
    "hf-assisted": "transformers' assisted generation with the draft model",
    "hf-pld": "transformers' prompt lookup",
    "vllm-spec": "vLLM's own speculative decoding",
}
GROUPS = (("lossless", "Lossless — the same tokens as ar"), ("lossy", "Lossy — quality measured against ar"),
          ("peers", "Peers — transformers / vLLM doing the same job"))


def strategy_group(name: str, lossless: bool) -> str:
    if name.startswith(("hf-", "vllm")):
        return "peers"
    return "lossless" if lossless else "lossy"


def grouped_catalogue(engine) -> dict[str, dict[str, list]]:
    """{group: {"available": [(label, name)], "unavailable": [(name, hint, why)]}} in registry order, groups
    lossless · lossy · peers; a label is "name — what it does"."""
    ok, bad = strategy_catalogue(engine)
    lossless = {}
    if getattr(engine, "remote", False):
        lossless = {d["name"]: bool(d.get("lossless")) for d in engine.catalogue()}
    out = {g: {"available": [], "unavailable": []} for g, _ in GROUPS}

    def info(name):
        if name in REGISTRY:
            return get(name).lossless, HINTS.get(name, get(name).title)
        return lossless.get(name, True), HINTS.get(name, name)
    for _, name in ok:
        ll, hint = info(name)
        out[strategy_group(name, ll)]["available"].append((f"{name} — {hint}", name))
    for name, why in bad:
        ll, hint = info(name)
        out[strategy_group(name, ll)]["unavailable"].append((name, hint, why))
    return out


def unavailable_html(rows: list[tuple[str, str, str]]) -> str:
    """Greyed entries for strategies that cannot run here, each with why (and the command that fixes it)."""
    if not rows:
        return ""
    items = "".join(f'<li class="pd-unavail-item" data-strategy="{html.escape(n)}"><s>{html.escape(n)}</s> — '
                    f'{html.escape(hint)}<br><span class="pd-why">unavailable: {html.escape(why)}</span></li>'
                    for n, hint, why in rows)
    return (f'<ul class="pd-unavailable" style="opacity:.6;font-size:12px;margin:2px 0 6px 0;padding-left:16px;'
            f'overflow-wrap:anywhere">{items}</ul>')


def strategy_catalogue(engine) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """([(label, name)] available, [(name, why + command)] unavailable), in registry order."""
    load_all()
    ok, bad = [], []
    if getattr(engine, "remote", False):
        for d in engine.catalogue():
            label = f"{d['name']} — {d['title']}" + ("" if d.get("lossless") else " (lossy)")
            (ok if d.get("available") else bad).append((label, d["name"]) if d.get("available")
                                                       else (d["name"], d.get("why", "")))
        return ok, bad
    for name in REGISTRY:
        s = get(name)
        try:
            avail, why = s.available(engine)
        except Exception as e:  # noqa: BLE001 - an availability check must not take the page down
            avail, why = False, f"{type(e).__name__}: {e}"
        label = f"{name} — {s.title}" + ("" if s.lossless else " (lossy)")
        (ok if avail else bad).append((label, name) if avail else (name, why))
    return ok, bad


def param_strategies() -> list[str]:
    """Strategies that have parameters, in registry order: one JSON box each in the Arena (and the API)."""
    load_all()
    return [n for n in REGISTRY if get(n).params]


def default_params_json(name: str) -> str:
    return json.dumps({k: p.default for k, p in get(name).params.items()})


def parse_params(names: list[str], texts: list[str]) -> dict[str, dict]:
    """{strategy: params} from the per-strategy JSON boxes; raises RequestError naming the box."""
    out = {}
    for name, text in zip(names, texts):
        text = (text or "").strip()
        if not text:
            continue
        try:
            val = json.loads(text)
        except json.JSONDecodeError as e:
            raise RequestError(f"parameters of {name}: not valid JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(val, dict):
            raise RequestError(f"parameters of {name}: expected a JSON object like {default_params_json(name)}")
        strat = get(name)
        strat.resolve_params(Request(params=val))     # validates names, types and ranges
        out[name] = val
    return out


def _fmt(v, spec: str, unit: str = "") -> str:
    return "–" if v is None else f"{format(v, spec)}{unit}"


def _groups_html(groups: list[dict]) -> str:
    """Text of a list of token groups; a group of more than one token (one multi-token step) is shaded,
    alternating two colours so neighbouring groups stay apart."""
    parts, k = [], 0
    for g in groups:
        t = html.escape(g["text"])
        if not t:
            continue
        if len(g["ids"]) > 1:
            parts.append(f'<span class="pd-grp" title="{len(g["ids"])} tokens in one step" '
                         f'style="background:{SHADES[k % 2]};border-radius:3px">{t}</span>')
            k += 1
        else:
            parts.append(t)
    return "".join(parts)


def _text_block(d: dict) -> str:
    style = ("white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,monospace;font-size:13px;"
             "line-height:1.45;min-height:6em;max-height:18em;overflow:auto;padding:6px;"
             "background:var(--background-fill-secondary,#fafafa);border-radius:6px")
    groups = d.get("groups", [])
    segs = sorted({g["segment"] for g in groups})
    if len(segs) <= 1 and not d.get("stage"):
        return f'<div class="pd-text" style="{style}">{_groups_html(groups)}</div>'
    # Skeleton-of-Thought (or any multi-segment strategy): segment 0 the skeleton, then the points side by side
    skeleton = [g for g in groups if g["segment"] == 0]
    points = [s for s in segs if s != 0]
    out = []
    if skeleton:
        out.append(f'<div class="pd-skeleton" style="{style};min-height:2em;opacity:.75">'
                   f'<b>skeleton</b>\n{_groups_html(skeleton)}</div>')
    if points:
        fallback = bool(d.get("info", {}).get("fallback"))
        boxes = "".join(
            f'<div class="pd-point" style="{style};min-height:3em;max-height:14em">'
            f'<b>{"answer (fallback)" if fallback else f"point {s}"}</b>\n'
            f'{_groups_html([g for g in groups if g["segment"] == s])}</div>' for s in points)
        out.append('<div class="pd-points" style="display:grid;grid-template-columns:repeat(auto-fill,'
                   f'minmax(150px,1fr));gap:6px;margin-top:6px">{boxes}</div>')
    return "".join(out) or f'<div class="pd-text" style="{style}"></div>'


def _check_line(name: str, d: dict, ar: dict | None) -> str:
    if name == "ar" or ar is None:
        return ""
    if not d.get("lossless_strategy", True):
        if d["status"] == "done" and ar["status"] == "done":
            from .. import quality
            rl = quality.rouge_l(d.get("text") or "", ar.get("text") or "")
            return (f'<div class="pd-check" style="font-size:12px;margin-top:4px;color:#8a5a00">lossy strategy · ROUGE-L vs ar '
                    f'{_fmt(rl, ".3f")}</div>')
        return '<div class="pd-check" style="font-size:12px;margin-top:4px;color:#8a5a00">lossy strategy</div>'
    if d["status"] == "done" and ar["status"] == "done":
        i = d.get("diverges_at")
        if i is None:
            i = first_divergence(d["token_ids"], ar["token_ids"])
        if i is None:
            return '<div class="pd-check" style="font-size:12px;margin-top:4px;color:#0a7a2f">lossless: identical to ar</div>'
        return f'<div class="pd-check" style="font-size:12px;margin-top:4px;color:#b00020">diverges from ar at token {i + 1}</div>'
    a, b = d.get("token_ids") or [], ar.get("token_ids") or []
    n = min(len(a), len(b))
    i = first_divergence(a[:n], b[:n])        # so far: a column that is only shorter has not diverged
    if i is not None:
        return f'<div class="pd-check" style="font-size:12px;margin-top:4px;color:#b00020">diverges from ar at token {i + 1}</div>'
    return '<div class="pd-check" style="font-size:12px;margin-top:4px;color:#555">identical to ar so far</div>'


def steps_histogram(groups: list[dict]) -> str:
    """After the race: how many steps brought 1, 2, 3… tokens (the column's acceptance at a glance)."""
    counts: dict[int, int] = {}
    for g in groups:
        n = len(g.get("ids") or [])
        if n:
            counts[n] = counts.get(n, 0) + 1
    if not counts:
        return ""
    top = max(counts.values())
    rows = "".join(
        f'<span style="text-align:right">{k}</span><span style="display:flex;align-items:center;gap:4px">'
        f'<span style="display:inline-block;height:9px;width:{max(2, round(100 * v / top))}%;max-width:calc(100% - 3em);'
        f'background:#1f6feb;border-radius:2px"></span><span>{v}</span></span>' for k, v in sorted(counts.items()))
    return (f'<div class="pd-hist" style="font-size:11px;margin-top:6px"><div style="color:#666">tokens per step '
            f'(steps)</div><div style="display:grid;grid-template-columns:2.2em 1fr;gap:1px 6px">{rows}</div></div>')


COPY_BUTTON = ('<button class="pd-copy" type="button" title="copy this column\'s text" style="font-size:11px;'
               'padding:0 6px;border:1px solid var(--border-color-primary,#ccc);border-radius:4px;'
               'background:transparent;cursor:pointer">copy</button>')
# one listener per column (gradio's js_on_load): the copy button puts the column's text on the clipboard
COPY_JS = """
element.addEventListener('click', (e) => {
  const b = e.target.closest('.pd-copy'); if (!b) return;
  const col = b.closest('.pd-col'); const src = col && col.querySelector('.pd-answer');
  const text = src ? src.textContent : '';
  const done = () => { b.textContent = 'copied'; setTimeout(() => { b.textContent = 'copy'; }, 1200); };
  if (navigator.clipboard && window.isSecureContext) { navigator.clipboard.writeText(text).then(done, done); }
  else { const t = document.createElement('textarea'); t.value = text; document.body.appendChild(t); t.select();
         try { document.execCommand('copy'); } catch (err) {} t.remove(); done(); }
});
"""


STATUS_BADGE = {"waiting": ("#777", "waiting"), "running": ("#1f6feb", "running"), "done": ("#0a7a2f", "done"),
                "stopped": ("#8a5a00", "stopped"), "error": ("#b00020", "error")}


def render_column(name: str, d: dict, ar: dict | None, note: str = "") -> str:
    """One strategy's column: title, streamed text (groups shaded), live figures and the ar check."""
    title = REGISTRY[name].title if name in REGISTRY else name
    color, label = STATUS_BADGE.get(d.get("status", "waiting"), ("#777", d.get("status", "")))
    if d.get("status") == "done" and d.get("finish_reason"):
        label += f" ({d['finish_reason']})"
    rows = [("elapsed", _fmt(d.get("elapsed_s"), ".3f", " s")), ("TTFT", _fmt(d.get("ttft_s"), ".3f", " s")),
            ("tokens", str(d.get("tokens") or 0)), ("tokens/s", _fmt(d.get("tokens_per_s"), ".1f")),
            ("forward passes", str(d.get("forward_passes") or 0)),
            ("tokens/pass", _fmt(d.get("tokens_per_pass"), ".2f"))]
    if d.get("draft_passes"):
        rows.append(("draft passes", str(d["draft_passes"])))
    if d.get("acceptance") is not None:
        rows.append(("acceptance", _fmt(d["acceptance"], ".0%")))
    if ar is not None and name != "ar":
        rows.append(("speed-up vs ar", _fmt(d.get("speedup"), ".2f", "×")))
    figs = "".join(f'<span style="color:#666">{k}</span>'
                   f'<span class="pd-fig" data-fig="{k}" style="text-align:right;font-variant-numeric:tabular-nums">'
                   f'{v}</span>' for k, v in rows)
    err = (f'<div class="pd-error" style="color:#b00020">{html.escape(d["error"])}</div>'
           if d.get("error") else "")
    info = d.get("info") or {}
    extra = ""
    if info.get("fallback"):
        extra = f'<div style="color:#8a5a00;font-size:12px">fallback: {html.escape(str(info["fallback"]))}</div>'
    ended = d.get("status") in ("done", "stopped")
    hist = steps_histogram(d.get("groups") or []) if ended else ""
    text = d.get("text") or "".join(g["text"] for g in d.get("groups") or [])   # (SoT stopped in its skeleton)
    copy = COPY_BUTTON if text else ""
    answer = f'<span class="pd-answer" hidden>{html.escape(text)}</span>' if copy else ""
    dot = (f'<span style="display:inline-block;width:9px;height:9px;border-radius:50%;'
           f'background:{charts.strategy_colour(name)};margin-right:4px"></span>')
    return (f'<div class="pd-col" data-strategy="{html.escape(name)}" data-status="{html.escape(d.get("status", ""))}"'
            ' style="border:1px solid var(--border-color-primary,#ddd);border-radius:8px;padding:8px;min-width:0">'
            f'<div style="display:flex;justify-content:space-between;align-items:baseline;gap:6px;flex-wrap:wrap">'
            f'<div style="min-width:0;overflow-wrap:anywhere">{dot}<b>{html.escape(name)}</b> '
            f'<span style="color:#666;font-size:12px">{html.escape(title)}</span></div>'
            f'<span style="display:flex;gap:6px;align-items:baseline">{copy}'
            f'<span class="pd-status" style="color:{color};font-size:12px">{html.escape(label)}</span></span></div>'
            f'{_text_block(d)}{answer}{extra}{err}'
            f'<div class="pd-figs" style="display:grid;grid-template-columns:1fr auto;gap:1px 10px;font-size:12px;'
            f'margin-top:6px">{figs}</div>'
            f'{_check_line(name, d, ar)}{hist}{note}</div>')


def render_all(snap: dict[str, dict]) -> list[str]:
    ar = snap.get("ar")
    return [render_column(n, d, ar) for n, d in snap.items()]


def _waiting(name: str, why: str = "waiting for the engine…") -> str:
    return render_column(name, {"status": "waiting", "groups": [], "token_ids": []}, None,
                         note=f'<div style="color:#777;font-size:12px">{html.escape(why)}</div>')


def _replay_snapshot(race: Race, t: float) -> dict[str, dict]:
    """Every lane as it stood at time `t` of its own compute clock (for the replay)."""
    final = race.snapshot()
    out = {}
    for n, lane in race.lanes.items():
        d = dict(final[n])
        steps = [s for s in lane.steps if s.t_end <= t + 1e-12]
        d.update(step_figures(steps).as_dict())
        groups = [g for g in lane.groups if g["t"] <= t + 1e-12]
        d["groups"] = groups
        d["token_ids"] = [i for g in groups for i in g["ids"]]
        d["status"] = final[n]["status"] if len(steps) == len(lane.steps) else "running"
        out[n] = d
    ar = out.get("ar")
    for n, d in out.items():
        sp = speedup([d.get("tokens_per_s")], [ar.get("tokens_per_s")]) if ar and n != "ar" else None
        if sp is not None:
            d["speedup"] = sp
        if d["status"] != "done" or (ar and ar["status"] != "done"):
            d["diverges_at"] = None
    return out


# ---------------------------------------------------------------------------------------------- the tab
class Arena:
    """State of the Arena for one app: the engine, the store and each browser session's current race."""

    def __init__(self, engine, store):
        self.engine = engine
        self.store = store
        self.races: dict[str, Race] = {}           # session -> the race running or last run
        self.saved: dict[int, threading.Event] = {}  # id(race) -> set when its run is stored
        self.run_ids: dict[int, int] = {}          # id(race) -> run id
        self.available, self.unavailable = strategy_catalogue(engine)
        self.param_names = param_strategies()

    # ------------------------------------------------------------------ saving
    def _save(self, race: Race, settings: dict) -> None:
        try:
            race.wait()
            names = list(race.lanes)
            stopped = any(lane.status == "stopped" for lane in race.lanes.values())
            bs = BenchSettings(strategies=names, max_new_tokens=race.request.max_new_tokens,
                               temperature=race.request.temperature, top_p=race.request.top_p,
                               seed=race.request.seed, warmup=False, params=settings.get("params", {}),
                               max_context=race.request.max_context)
            desc = self.engine.describe()
            run_id = self.store.create_run(
                "race", name=race.request.prompt[:80].replace("\n", " "), model=desc["model"],
                device=desc["device"], dtype=desc["dtype"], environment=environment(self.engine, bs),
                strategies=names, settings=settings)
            ar = race.lanes.get("ar")
            ar_out = (ar.token_ids, ar.text) if ar is not None else None
            for lane in race.lanes.values():
                self.store.add_result(run_id, **result_row(lane, race.request, item_key="arena", category="arena",
                                                           ar=ar_out, engine=self.engine))
            self.store.finish_run(run_id, "interrupted" if stopped else "finished",
                                  error="stopped by the user" if stopped else None)
            self.run_ids[id(race)] = run_id
        finally:
            self.saved.setdefault(id(race), threading.Event()).set()

    def _status(self, race: Race, elapsed: float, snap: dict[str, dict], snap_done: bool) -> str:
        """The status line of one frame, from the same snapshot its columns are drawn from (`snap_done`: the race
        had ended before `snap` was taken), so a frame never says Stopped above columns still running."""
        rid = self.run_ids.get(id(race))
        if snap_done:
            stopped = any(d["status"] == "stopped" for d in snap.values())
            head = "**Stopped**" if stopped else "**Finished**"
            saved = f" · saved as run #{rid} (see the Dashboard)" if rid else ""
            return f"{head} in {elapsed:.1f} s wall time{saved}. Press **Replay** to watch each column at its own pace."
        n_run = sum(d["status"] == "running" for d in snap.values())
        return f"Racing {len(snap)} strategies ({n_run} running) · {elapsed:.1f} s"

    # ------------------------------------------------------------------ handlers
    def prepare(self, strategies):
        """Instant: show one column per picked strategy (in the queue's waiting state), hide the rest."""
        names = list(strategies or [])[:MAX_COLUMNS]
        ups = [gr.update(visible=i < len(names), value=_waiting(names[i]) if i < len(names) else "")
               for i in range(MAX_COLUMNS)]
        chart = charts.race_chart({n: {"groups": []} for n in names})
        return ups + ["Waiting for the engine (other sessions' races run first)…", chart]

    def race(self, prompt, mode, strategies, max_new_tokens, temperature, top_p, seed, max_context=0,
             request: gr.Request = None, *param_texts):
        # (gradio injects `request` only into a positional parameter, hence its place before *param_texts)
        """Start a race and stream every column at once until it ends."""
        names = list(dict.fromkeys(strategies or []))
        if not names:
            raise gr.Error("pick at least one strategy")
        if len(names) > MAX_COLUMNS:
            raise gr.Error(f"at most {MAX_COLUMNS} strategies race at once; {len(names)} are selected")
        bad = [n for n in names if n not in dict((v, v) for _, v in self.available)]
        if bad:
            why = dict(self.unavailable)
            raise gr.Error("not available here: " + "; ".join(f"{n}: {why.get(n, 'unknown strategy')}" for n in bad))
        try:
            params = parse_params(self.param_names, list(param_texts))
            req = Request(prompt=prompt or "", chat=(mode != "raw completion"), max_new_tokens=int(max_new_tokens),
                          temperature=float(temperature), top_p=float(top_p), seed=int(seed),
                          max_context=int(max_context or 0))
            req.validate(length_check_engine(self.engine, names))
        except RequestError as e:
            raise gr.Error(str(e)) from None
        except (TypeError, ValueError) as e:
            raise gr.Error(f"invalid setting: {e}") from None
        params = {n: params[n] for n in names if n in params}
        race = Race(self.engine, req, names, params)
        session = getattr(request, "session_hash", None) or "default"
        old = self.races.get(session)
        if old is not None and not old.finished.is_set():
            old.stop()
        self.races[session] = race
        self.saved[id(race)] = threading.Event()
        settings = {"prompt": req.prompt, "chat": req.chat, "max_new_tokens": req.max_new_tokens,
                    "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed, "params": params,
                    "max_context": req.max_context}
        threading.Thread(target=self._save, args=(race, settings), name="paradec-race-save", daemon=True).start()
        t0 = time.perf_counter()
        race.start()
        last = last_chart = 0.0
        try:
            while True:
                try:
                    ev = next(race.events(timeout=FRAME_S))
                except queue.Empty:
                    ev = None
                done = ev is not None and ev["type"] == "done"
                now = time.perf_counter()
                if done:
                    self.saved[id(race)].wait(30)
                # once stopping, only the final frame: one drawn while the lanes end one by one would show some
                # still running, and could reach the page after the final one
                if done or (now - last >= FRAME_S and not race.stopping):
                    last = now
                    chart = done or now - last_chart >= CHART_S
                    if chart:
                        last_chart = now
                    yield self._frame(race, names, now - t0, chart=chart)
                if done:
                    return
        finally:
            if not race.finished.is_set():      # the handler was cancelled or the page went away
                race.stop()

    def _frame(self, race: Race, names: list[str], elapsed: float, chart: bool = True):
        done = race.finished.is_set()       # read BEFORE the snapshot: if set, the snapshot is the final state
        snap = race.snapshot()
        cols = render_all({n: snap[n] for n in names})
        ups = [gr.update(visible=True, value=cols[i]) if i < len(cols) else gr.update(visible=False)
               for i in range(MAX_COLUMNS)]
        figs = {n: {k: snap[n][k] for k in ("status", "tokens", "elapsed_s", "ttft_s", "tokens_per_s",
                                            "forward_passes", "tokens_per_pass", "speedup", "diverges_at",
                                            "finish_reason", "error", "text")} for n in names}
        rid = self.run_ids.get(id(race))
        return ups + [self._status(race, elapsed, snap, done), {"run_id": rid, "finished": done,
                                                      "lanes": figs},
                      charts.race_chart({n: snap[n] for n in names}) if chart else gr.update()]

    def stop(self, request: gr.Request = None):
        """Stop the session's race between steps (the model work really stops)."""
        session = getattr(request, "session_hash", None) or "default"
        race = self.races.get(session)
        if race is None or race.finished.is_set():
            return "Nothing is running."
        race.stop()
        return "Stopping…"

    def after_stop(self, request: gr.Request = None):
        """After Stop: wait for the race to end and be saved, and show its final state (the streaming handler shows
        the same one; this covers a page whose streaming handler has gone)."""
        session = getattr(request, "session_hash", None) or "default"
        race = self.races.get(session)
        if race is None:
            return [gr.update() for _ in range(MAX_COLUMNS)] + ["Nothing is running.", gr.update(), gr.update()]
        race.wait(30)
        self.saved.get(id(race), threading.Event()).wait(30)
        started = race.started_at or time.time()
        return self._frame(race, list(race.lanes), time.time() - started)

    def replay(self, speed, request: gr.Request = None):
        """Replay the session's last race with every column at its own measured pace."""
        session = getattr(request, "session_hash", None) or "default"
        race = self.races.get(session)
        if race is None or not race.finished.is_set():
            raise gr.Error("there is no finished race to replay yet: run one first")
        speed = float(speed or 1.0)
        if speed <= 0:
            raise gr.Error("the replay speed must be above 0")
        names = list(race.lanes)
        sched = race.replay_schedule()
        end = max((t for t, _, _ in sched), default=0.0)
        t0 = time.perf_counter()
        last_chart = -1.0
        while True:
            now = time.perf_counter()
            t = (now - t0) * speed
            snap = _replay_snapshot(race, t)
            cols = render_all(snap)
            ups = [gr.update(visible=True, value=cols[i]) if i < len(cols) else gr.update(visible=False)
                   for i in range(MAX_COLUMNS)]
            chart = gr.update()
            if t >= end or now - last_chart >= CHART_S:      # the lines grow at each strategy's measured pace
                last_chart = now
                chart = charts.race_chart(snap, t_now=min(t, end))
            yield ups + [f"Replay at {speed:g}× · t = {min(t, end):.2f} s of compute time (each column on its "
                         f"own clock)", gr.update(), chart]
            if t >= end:
                return
            time.sleep(FRAME_S)

    def unload(self, request: gr.Request = None):
        """The page was closed: stop its race (it is saved as stopped)."""
        session = getattr(request, "session_hash", None)
        race = self.races.get(session) if session else None
        if race is not None and not race.finished.is_set():
            race.stop()

    # ------------------------------------------------------------------ layout
    def build(self):
        avail_names = [v for _, v in self.available]
        # ticked at first: ar, pld (needs nothing trained) and the fastest lossless strategy on the default model
        # (eagle, where its draft ships; lookahead elsewhere)
        first = ("ar", "pld", "eagle") if "eagle" in avail_names else ("ar", "pld", "lookahead")
        default = [n for n in first if n in avail_names] or avail_names[:2]
        groups = grouped_catalogue(self.engine)
        with gr.Row(equal_height=False, elem_id="pd-arena"):
            # left: the controls, compact; right: the race itself, at the top of the page
            with gr.Column(scale=1, min_width=340, elem_id="pd-controls"):
                prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=3, max_lines=12, elem_id="pd-prompt")
                mode = gr.Radio(["chat", "raw completion"], value="chat", label="Mode", elem_id="pd-mode",
                                info="chat applies the model's chat template; raw completion continues the text")
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="pd-run", min_width=60)
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="pd-stop", min_width=60)
                    replay_btn = gr.Button("Replay", elem_id="pd-replay", min_width=60)
                max_new = gr.Slider(1, 1024, value=128, step=1, label="Max new tokens", elem_id="pd-max-new")
                boxes_by_group = []
                for key, title in GROUPS:
                    g = groups[key]
                    if not g["available"] and not g["unavailable"]:
                        continue
                    names = [v for _, v in g["available"]]
                    box = gr.CheckboxGroup(g["available"], value=[n for n in default if n in names], label=title,
                                           elem_id=f"pd-strategies-{key}", elem_classes=["pd-strategy-group"],
                                           visible=bool(g["available"]))
                    boxes_by_group.append(box)
                    if g["unavailable"]:
                        gr.HTML(unavailable_html(g["unavailable"]), elem_id=f"pd-unavailable-{key}")
                # the race reads one list: the union of the groups' ticks (kept in sync, also the API's input)
                strategies = gr.CheckboxGroup(self.available, value=default, label="Strategies", visible="hidden",
                                              elem_id="pd-strategies")
                with gr.Accordion("Sampling, context window and replay", open=False):
                    temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                    seed = gr.Number(0, precision=0, minimum=0, label="Seed")
                    max_context = gr.Number(0, precision=0, minimum=0, label="Context window (tokens, 0 = the model's)",
                                            elem_id="pd-max-context",
                                            info="smaller than the model's context: long-context strategies (pcw, "
                                                 "focus) are tried beyond their window; every other one refuses a "
                                                 "prompt that does not fit it")
                    speed = gr.Number(1.0, label="Replay speed (×)", minimum=0.01, maximum=100)
                with gr.Accordion("Strategy parameters (JSON per strategy)", open=False):
                    boxes = []
                    for n in self.param_names:
                        help_ = "; ".join(f"{k}: {p.help}" for k, p in get(n).params.items() if p.help)
                        boxes.append(gr.Textbox(default_params_json(n), label=f"{n} — {get(n).title}", info=help_,
                                                lines=1, max_lines=4))
            with gr.Column(scale=3, elem_id="pd-race"):
                status = gr.Markdown("Pick strategies on the left and press **Run**: each gets a column here.",
                                     elem_id="pd-race-status")
                with gr.Row(equal_height=False, elem_id="pd-columns"):
                    cols = [gr.HTML("", visible=False, elem_id=f"pd-col-{i}", elem_classes=["pd-slot"],
                                    min_width=200, js_on_load=COPY_JS) for i in range(MAX_COLUMNS)]
                chart = gr.Plot(charts.race_chart({}), label="Tokens vs own compute time", show_label=False,
                                elem_id="pd-race-chart")
                gr.Markdown("<small>Every column's figures are its own compute time (the race runner times each "
                            "step alone, device synchronised), so they are what the strategy would take alone. "
                            "Shaded text: tokens that arrived together in one multi-token step. Every race is "
                            "saved as a run when it ends or is stopped.</small>")
                with gr.Accordion("Race figures (JSON)", open=False):
                    figures_json = gr.JSON(label="figures", elem_id="pd-race-json")

        def merge(*ticked):
            picked = {n for t in ticked for n in (t or [])}
            return [n for n in avail_names if n in picked]
        for box in boxes_by_group:
            box.change(merge, boxes_by_group, [strategies], queue=False, api_visibility="undocumented")

        outs = cols + [status, figures_json, chart]
        prep = run_btn.click(self.prepare, [strategies], cols + [status, chart], queue=False,
                             api_visibility="undocumented")
        race_ev = prep.then(self.race, [prompt, mode, strategies, max_new, temperature, top_p, seed, max_context,
                                        *boxes], outs,
                            api_name="race", concurrency_id="engine", concurrency_limit=1,
                            show_progress="minimal")
        # Stop ends the race between two steps; the streaming handler then draws the final frame itself (no frame
        # while the lanes end). Cancelling that handler instead let a frame it had already sent land after the
        # final one and paint the columns as running again (seen in the browser test).
        stop_ev = stop_btn.click(self.stop, None, [status], api_name="stop", concurrency_limit=None, queue=True)
        after = stop_ev.then(self.after_stop, None, outs, api_name="after_stop", concurrency_limit=None)
        replay_btn.click(self.replay, [speed], outs, api_name="replay", concurrency_limit=None,
                         show_progress="hidden")
        return {"prompt": prompt, "mode": mode, "strategies": strategies, "max_new_tokens": max_new,
                "temperature": temperature, "top_p": top_p, "seed": seed, "max_context": max_context,
                "param_boxes": boxes, "columns": cols,
                "status": status, "figures": figures_json, "chart": chart, "strategy_groups": boxes_by_group,
                "ended": [race_ev, after]}
