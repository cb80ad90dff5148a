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
from dataclasses import asdict

import gradio as gr

from ..bench import BenchSettings, environment
from ..metrics import figures as step_figures
from ..race import Race, first_divergence
from ..strategies import REGISTRY, Request, RequestError, get, length_check_engine, load_all

MAX_COLUMNS = 8
FRAME_S = 1 / 15            # at most ~15 updates a second
SHADES = ("#cfe3ff", "#ffe2b8")   # alternate backgrounds of multi-token groups
DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


# ---------------------------------------------------------------------------------------------- helpers
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
             "line-height:1.45;min-height:6em;max-height:26em;overflow:auto;padding:6px;"
             "background:var(--background-fill-secondary,#fafafa);border-radius:6px")
    groups = d.get("groups", [])
    segs = sorted({g["segment"] for g in groups})
    if len(segs) <= 1 and not d.get("info", {}).get("stage"):
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
            return (f'<div class="pd-check" style="color:#8a5a00">lossy strategy · ROUGE-L vs ar '
                    f'{_fmt(rl, ".3f")}</div>')
        return '<div class="pd-check" style="color:#8a5a00">lossy strategy</div>'
    if d["status"] == "done" and ar["status"] == "done":
        i = d.get("diverges_at")
        if i is None:
            i = first_divergence(d["token_ids"], ar["token_ids"])
        if i is None:
            return '<div class="pd-check" style="color:#0a7a2f">lossless: identical to ar</div>'
        return f'<div class="pd-check" style="color:#b00020">diverges from ar at token {i + 1}</div>'
    a, b = d.get("token_ids") or [], ar.get("token_ids") or []
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is not None:
        return f'<div class="pd-check" style="color:#b00020">diverges from ar at token {i + 1}</div>'
    return '<div class="pd-check" style="color:#555">identical to ar so far</div>'


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
    return (f'<div class="pd-col" data-strategy="{html.escape(name)}" data-status="{html.escape(d.get("status", ""))}"'
            ' style="border:1px solid var(--border-color-primary,#ddd);border-radius:8px;padding:8px">'
            f'<div style="display:flex;justify-content:space-between;align-items:baseline;gap:6px">'
            f'<div><b>{html.escape(name)}</b> <span style="color:#666;font-size:12px">{html.escape(title)}</span></div>'
            f'<span class="pd-status" style="color:{color};font-size:12px">{html.escape(label)}</span></div>'
            f'{_text_block(d)}{extra}{err}'
            f'<div class="pd-figs" style="display:grid;grid-template-columns:1fr auto;gap:1px 10px;font-size:12px;'
            f'margin-top:6px">{figs}</div>'
            f'{_check_line(name, d, ar)}{note}</div>')


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
        if ar and n != "ar" and d.get("tokens_per_s") and ar.get("tokens_per_s"):
            d["speedup"] = d["tokens_per_s"] / ar["tokens_per_s"]
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
            snap = race.snapshot()
            names = list(race.lanes)
            stopped = any(d["status"] == "stopped" for d in snap.values())
            bs = BenchSettings(strategies=names, max_new_tokens=race.request.max_new_tokens,
                               temperature=race.request.temperature, top_p=race.request.top_p,
                               seed=race.request.seed, warmup=False, params=settings.get("params", {}))
            desc = self.engine.describe()
            run_id = self.store.create_run(
                "race", name=race.request.prompt[:80].replace("\n", " "), model=desc["model"],
                device=desc["device"], dtype=desc["dtype"], environment=environment(self.engine, bs),
                strategies=names, settings=settings)
            ar = snap.get("ar")
            from .. import quality
            for n, d in snap.items():
                q = {"lossless_strategy": d["lossless_strategy"], "status": d["status"],
                     "finish_reason": d["finish_reason"]}
                if ar is not None and n != "ar" and not d["error"]:
                    q.update(quality.quality_row(d["text"], d["token_ids"], ar_text=ar["text"], ar_ids=ar["token_ids"]))
                    q["exact_match"] = d["token_ids"] == ar["token_ids"]
                    q["diverges_at"] = first_divergence(d["token_ids"], ar["token_ids"])
                self.store.add_result(
                    run_id, item_key="arena", category="arena", strategy=n, prompt=race.request.prompt,
                    text=d["text"], token_ids=d["token_ids"], n_tokens=d["tokens"],
                    forward_passes=d["forward_passes"], draft_passes=d["draft_passes"], drafted=d["drafted"],
                    accepted=d["accepted"], ttft_s=d["ttft_s"], e2e_s=d["elapsed_s"],
                    tokens_per_s=d["tokens_per_s"], tpot_s=d["tpot_s"], tokens_per_pass=d["tokens_per_pass"],
                    itl=d["itl"], quality=q, error=d["error"])
            self.store.finish_run(run_id, "interrupted" if stopped else "finished",
                                  error="stopped by the user" if stopped else None)
            self.run_ids[id(race)] = run_id
        finally:
            self.saved.setdefault(id(race), threading.Event()).set()

    def _status(self, race: Race, elapsed: float) -> str:
        snap_done = race.finished.is_set()
        rid = self.run_ids.get(id(race))
        if snap_done:
            stopped = any(l.status == "stopped" for l in race.lanes.values())
            head = "**Stopped**" if stopped else "**Finished**"
            saved = f" · saved as run #{rid} (see the Dashboard)" if rid else ""
            return f"{head} in {elapsed:.1f} s wall time{saved}. Press **Replay** to watch each column at its own pace."
        n_run = sum(l.status == "running" for l in race.lanes.values())
        return f"Racing {len(race.lanes)} strategies ({n_run} running) · {elapsed:.1f} s"

    # ------------------------------------------------------------------ handlers
    def prepare(self, strategies):
        """Instant: show one column per picked strategy (in the queue's waiting state), hide the rest."""
        names = list(strategies or [])[:MAX_COLUMNS]
        ups = [gr.update(visible=i < len(names), value=_waiting(names[i]) if i < len(names) else "")
               for i in range(MAX_COLUMNS)]
        return ups + ["Waiting for the engine (other sessions' races run first)…"]

    def race(self, prompt, mode, strategies, max_new_tokens, temperature, top_p, seed, request: gr.Request = None,
             *param_texts):
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
                          temperature=float(temperature), top_p=float(top_p), seed=int(seed))
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
                    "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed, "params": params}
        threading.Thread(target=self._save, args=(race, settings), name="paradec-race-save", daemon=True).start()
        t0 = time.perf_counter()
        race.start()
        last = 0.0
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
                if done or now - last >= FRAME_S:
                    last = now
                    yield self._frame(race, names, now - t0)
                if done:
                    return
        finally:
            if not race.finished.is_set():      # the handler was cancelled or the page went away
                race.stop()

    def _frame(self, race: Race, names: list[str], elapsed: float):
        snap = race.snapshot()
        cols = render_all({n: snap[n] for n in names})
        ups = [gr.update(visible=True, value=cols[i]) if i < len(cols) else gr.update(visible=False)
               for i in range(MAX_COLUMNS)]
        figs = {n: {k: snap[n][k] for k in ("status", "tokens", "elapsed_s", "ttft_s", "tokens_per_s",
                                            "forward_passes", "tokens_per_pass", "speedup", "diverges_at",
                                            "finish_reason", "error", "text")} for n in names}
        rid = self.run_ids.get(id(race))
        return ups + [self._status(race, elapsed), {"run_id": rid, "finished": race.finished.is_set(),
                                                      "lanes": figs}]

    def stop(self, request: gr.Request = None):
        """Stop the session's race between steps (the model work really stops)."""
        session = getattr(request, "session_hash", None) or "default"
        race = self.races.get(session)
        if race is None or race.finished.is_set():
            return "Nothing is running."
        race.stop()
        return "Stopping…"

    def after_stop(self, request: gr.Request = None):
        """After Stop (which also cancels the streaming handler): wait for the race to end and be saved, and
        show its final state."""
        session = getattr(request, "session_hash", None) or "default"
        race = self.races.get(session)
        if race is None:
            return [gr.update() for _ in range(MAX_COLUMNS)] + ["Nothing is running.", gr.update()]
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
        while True:
            t = (time.perf_counter() - t0) * speed
            snap = _replay_snapshot(race, t)
            cols = render_all(snap)
            ups = [gr.update(visible=True, value=cols[i]) if i < len(cols) else gr.update(visible=False)
                   for i in range(MAX_COLUMNS)]
            yield ups + [f"Replay at {speed:g}× · t = {min(t, end):.2f} s of compute time (each column on its "
                         f"own clock)", gr.update()]
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
        default = [n for n in ("ar", "pld", "lookahead") if n in avail_names] or avail_names[:2]
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=4, elem_id="pd-prompt")
                mode = gr.Radio(["chat", "raw completion"], value="chat", label="Mode",
                                info="chat applies the model's chat template; raw completion continues the text")
            with gr.Column(scale=2):
                strategies = gr.CheckboxGroup(self.available, value=default, label="Strategies",
                                              elem_id="pd-strategies")
                if self.unavailable:
                    gr.Markdown("<span style='opacity:.6'>Unavailable with this model:<br>" + "<br>".join(
                        f"☐ <s>{html.escape(n)}</s> — {html.escape(why)}" for n, why in self.unavailable) +
                        "</span>", elem_id="pd-unavailable")
        with gr.Row():
            max_new = gr.Slider(1, 1024, value=128, step=1, label="Max new tokens", elem_id="pd-max-new")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
            seed = gr.Number(0, precision=0, minimum=0, label="Seed")
        with gr.Accordion("Strategy parameters (JSON per strategy)", open=False):
            boxes = []
            for n in self.param_names:
                help_ = "; ".join(f"{k}: {p.help}" for k, p in get(n).params.items() if p.help)
                boxes.append(gr.Textbox(default_params_json(n), label=f"{n} — {get(n).title}", info=help_,
                                        lines=1, max_lines=4))
        with gr.Row():
            run_btn = gr.Button("Run", variant="primary", elem_id="pd-run")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="pd-stop")
            replay_btn = gr.Button("Replay", elem_id="pd-replay")
            speed = gr.Number(1.0, label="Replay speed (×)", minimum=0.01, maximum=100, scale=0, min_width=120)
        status = gr.Markdown("", elem_id="pd-race-status")
        with gr.Row(equal_height=False):
            cols = [gr.HTML("", visible=False, elem_id=f"pd-col-{i}", elem_classes=["pd-slot"], min_width=220)
                    for i in range(MAX_COLUMNS)]
        with gr.Accordion("Race figures (JSON)", open=False):
            figures_json = gr.JSON(label="figures", elem_id="pd-race-json")
        gr.Markdown("<small>Every column's figures are its own compute time (the race runner times each "
                    "step alone, device synchronised), so they are what the strategy would take alone. "
                    "Shaded text: tokens that arrived together in one multi-token step. Every race is saved "
                    "as a run when it ends or is stopped.</small>")

        outs = cols + [status, figures_json]
        prep = run_btn.click(self.prepare, [strategies], cols + [status], queue=False, api_visibility="undocumented")
        race_ev = prep.then(self.race, [prompt, mode, strategies, max_new, temperature, top_p, seed, *boxes], outs,
                            api_name="race", concurrency_id="engine", concurrency_limit=1,
                            show_progress="minimal")
        stop_ev = stop_btn.click(self.stop, None, [status], api_name="stop", concurrency_limit=None,
                                 cancels=[race_ev], queue=True)
        stop_ev.then(self.after_stop, None, outs, api_name="after_stop", concurrency_limit=None)
        replay_btn.click(self.replay, [speed], outs, api_name="replay", concurrency_limit=None,
                         show_progress="hidden")
        return {"prompt": prompt, "mode": mode, "strategies": strategies, "max_new_tokens": max_new,
                "temperature": temperature, "top_p": top_p, "seed": seed, "param_boxes": boxes, "columns": cols,
                "status": status, "figures": figures_json}


def settings_dict(settings: BenchSettings) -> dict:
    return asdict(settings)
