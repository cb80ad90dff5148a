"""The Eval sets tab: upload and validate a set, run a benchmark on it (or on a built-in suite), resume one.

An upload is parsed and validated by `paradec.evalsets`; any problem is shown row by row in the page and
nothing is stored. A valid set is saved (one transaction) and becomes selectable. A benchmark run stores
every result as soon as it exists (`paradec.bench.run_bench`), so a run left 'running' or 'interrupted' by a
closed page, a Stop or a restart can be resumed from the dropdown without redoing finished rows.
"""
from __future__ import annotations

import html
import os
import threading
from dataclasses import asdict
from pathlib import Path

import gradio as gr
import pandas as pd

from .. import evalsets
from ..bench import BenchSettings, environment, items_from_evalset, items_from_store, run_bench, table
from .arena import strategy_catalogue

PREVIEW_ROWS = 10
RESUMABLE_KINDS = ("eval", "bench")


_MD_PUNCT = "\\`*_{}[]()<>#+-.!|~"


def md_text(s: str) -> str:
    """User text shown inside Markdown as plain text: HTML escaped and Markdown punctuation backslashed, so a
    category like `<img src=x>` or `[x](javascript:..)` renders as the characters it is."""
    return "".join("\\" + c if c in _MD_PUNCT else c for c in html.escape(" ".join(str(s).split()), quote=False))


def preview_frame(es) -> pd.DataFrame:
    rows = []
    for it in es.items[:PREVIEW_ROWS]:
        p = it.turns[0]
        rows.append({"id": it.item_id, "category": it.category,
                     "prompt": p if len(p) <= 160 else p[:157] + "…", "turns": len(it.turns),
                     "reference": (it.reference or "")[:80], "chat": it.chat})
    return pd.DataFrame(rows, columns=["id", "category", "prompt", "turns", "reference", "chat"])


def preview_frame_empty() -> pd.DataFrame:
    return pd.DataFrame(columns=["id", "category", "prompt", "turns", "reference", "chat"])


def error_markdown(err: evalsets.EvalSetError) -> str:
    head = f"**Not stored — {html.escape(err.filename or 'the file')} has {len(err.errors)} problem" \
           f"{'s' if len(err.errors) != 1 else ''}:**"
    lines = "\n".join(f"- {html.escape(e)}" for e in err.errors)
    return f"<div class='pd-upload-errors'>\n\n{head}\n\n{lines}\n\n</div>"


class EvalSetsTab:
    def __init__(self, engine, store):
        self.engine = engine
        self.store = store
        self.stop_flags: dict[str, threading.Event] = {}
        self.active_runs: set[int] = set()

    # ------------------------------------------------------------------ sources
    def source_choices(self) -> list[tuple[str, str]]:
        out = []
        for name, path in evalsets.builtin_suites().items():
            n = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
            out.append((f"Built-in suite: {name} ({n} prompts)", f"suite:{name}"))
        for s in self.store.list_eval_sets():
            out.append((f"Uploaded set #{s['id']}: {s['name']} ({s['n_items']} items)", f"set:{s['id']}"))
        return out

    def resumable(self) -> list[tuple[str, int]]:
        """Unfinished benchmark runs: 'interrupted', or 'running' but not by a live run of this process."""
        self.store.mark_interrupted_runs()
        out = []
        for r in self.store.list_runs():
            if r["kind"] not in RESUMABLE_KINDS or r["id"] in self.active_runs:
                continue
            mine_but_dead = r["status"] == "running" and r.get("pid") == os.getpid()
            if r["status"] == "interrupted" or mine_but_dead:
                out.append((f"#{r['id']} {r['name']} · {r['status']} · {r['n_results']} rows stored", r["id"]))
        return out

    def _items(self, source: str, limit: int):
        if not source:
            raise gr.Error("pick an eval set or a built-in suite")
        kind, _, key = source.partition(":")
        try:
            if kind == "suite":
                es = evalsets.load_suite(key)
                items, set_id, name = items_from_evalset(es), None, f"suite {key}"
            elif kind == "set":
                info = self.store.get_eval_set(int(key))
                if info is None:
                    raise gr.Error(f"eval set #{key} no longer exists")
                items, set_id, name = items_from_store(self.store, int(key)), int(key), info["name"]
            else:
                raise gr.Error(f"unknown source {source!r}")
        except evalsets.EvalSetError as e:
            raise gr.Error(str(e)) from None
        if limit and limit > 0:
            items = items[:int(limit)]
        return items, set_id, name

    # ------------------------------------------------------------------ handlers
    def upload(self, file):
        """Validate an uploaded file; store it only when every row is valid."""
        if file is None:
            return "", preview_frame_empty(), gr.update()
        path = file if isinstance(file, str) else getattr(file, "name", None) or file.get("path")
        try:
            local = not getattr(self.engine, "remote", False)
            es = evalsets.load_eval_set(path, filename=Path(path).name,
                                        max_prompt_tokens=self.engine.context_length if local else None,
                                        count_tokens=(lambda t: len(self.engine.tokenizer(t)["input_ids"]))
                                        if local else None)
        except evalsets.EvalSetError as e:
            return error_markdown(e), preview_frame_empty(), gr.update()
        set_id = self.store.save_eval_set(es, source_filename=Path(path).name)
        msg = (f"**Stored eval set #{set_id} “{html.escape(es.name)}”**: {len(es)} items "
               f"({es.format}), categories: {md_text(', '.join(es.categories))}. Showing the first "
               f"{min(len(es), PREVIEW_ROWS)} rows.")
        return msg, preview_frame(es), gr.update(choices=self.source_choices(), value=f"set:{set_id}")

    def running_speedups(self, run_id) -> str:
        """'pld 1.23× · lookahead 0.91×': each strategy's speed-up vs ar so far in the run (all categories)."""
        from . import charts
        df = self.store.results_dataframe(run_id, light=True)
        t = charts.speedup_table(df)
        if not len(t):
            return ""
        t = t[t["category"] == "all"] if (t["category"] == "all").any() else t
        g = t.groupby("strategy")["speedup"].mean()
        return " · ".join(f"{s} {charts.fmt_number(v, 'speedup')}" for s, v in g.items())

    def _progress_cb(self, progress, run_id=None, n_items=None, n_per_item=None):
        def cb(count, total, desc):
            text = desc
            if n_items and n_per_item:
                done = min(n_items, count // n_per_item)
                text = f"prompts {done}/{n_items} · {desc}"
            if run_id is not None:
                sp = self.running_speedups(run_id)
                if sp:
                    text += f" · speed-up so far: {sp}"
            progress((count, total), desc=text, unit="results")
        return cb

    def run(self, source, strategies, max_new_tokens, repeats, limit, progress=gr.Progress(),
            request: gr.Request = None):
        names = list(strategies or [])
        if not names:
            raise gr.Error("pick at least one strategy")
        items, set_id, name = self._items(source, int(limit or 0))
        settings = BenchSettings(strategies=names, repeats=int(repeats), max_new_tokens=int(max_new_tokens))
        from ..bench import too_long
        long = too_long(self.engine, items, settings.max_new_tokens, names)
        if long:        # checked as the run sends them (chat template, max_new_tokens), before a run is stored
            raise gr.Error("these prompts do not fit the model's context; lower max_new_tokens or drop them: "
                           + "; ".join(long))
        desc = self.engine.describe()
        run_id = self.store.create_run("eval", name=name, model=desc["model"], device=desc["device"],
                                       dtype=desc["dtype"], environment=environment(self.engine, settings),
                                       strategies=["ar"] + [s for s in names if s != "ar"],
                                       settings={"bench": asdict(settings), "source": source,
                                                 "limit": int(limit or 0)},
                                       eval_set_id=set_id)
        return self._execute(run_id, items, settings, progress, request, resume=False)

    def resume(self, run_id, progress=gr.Progress(), request: gr.Request = None):
        if run_id in (None, ""):
            raise gr.Error("pick an unfinished run to resume")
        run = self.store.get_run(int(run_id))
        if run is None:
            raise gr.Error(f"there is no run {run_id}")
        from ..bench import ResumeError, resume_plan
        from ..store import StoreError
        try:            # the same plan as `bench --resume`: a run made by either resumes in either
            settings, items = resume_plan(self.store, run)
            if int(run_id) in self.active_runs:
                raise StoreError(f"run {run_id} is being run right now in this app")
            self.store.resume_run(int(run_id))      # refuses while another process runs it
        except (ResumeError, StoreError) as e:
            raise gr.Error(str(e)) from None
        return self._execute(int(run_id), items, settings, progress, request, resume=True)

    def _execute(self, run_id, items, settings, progress, request, resume: bool):
        session = getattr(request, "session_hash", None) or "default"
        flag = self.stop_flags[session] = threading.Event()
        self.active_runs.add(run_id)
        progress((0, None), desc="warming up")
        try:
            per_item = max(1, len(set(["ar", *settings.strategies]))) * max(1, int(settings.repeats))
            cb = self._progress_cb(progress, run_id, len(items), per_item)
            res = run_bench(self.engine, self.store, run_id, items, settings, progress=cb,
                            should_stop=flag.is_set, resume=resume)
        except Exception as e:
            self.store.finish_run(run_id, "failed", error=f"{type(e).__name__}: {e}")
            raise gr.Error(f"run #{run_id} failed: {type(e).__name__}: {e}") from None
        finally:
            self.active_runs.discard(run_id)
        status = "interrupted" if res["stopped"] else "finished"
        self.store.finish_run(run_id, status)
        rows = table(self.store.results_dataframe(run_id))
        verb = "Resumed" if resume else "Ran"
        msg = (f"**{verb} run #{run_id}: {status}.** {res['stored']} results stored now, {res['skipped']} were "
               f"already stored, {res['total']} in all." +
               (" It can be resumed below." if res["stopped"] else
                f" Its charts: the **Dashboard** tab (pick run #{run_id} under *Runs*)."))
        from . import charts
        return msg, charts.summary_frame(rows), gr.update(choices=self.resumable(), value=None), int(run_id)

    def stop(self, request: gr.Request = None):
        session = getattr(request, "session_hash", None) or "default"
        flag = self.stop_flags.get(session)
        if flag is None:
            return "Nothing is running."
        flag.set()
        return "Stopping after the current result… (finished rows stay stored; resume the run later)"

    def refresh(self):
        return gr.update(choices=self.source_choices()), gr.update(choices=self.resumable())

    # ------------------------------------------------------------------ layout
    def build(self):
        available, unavailable = strategy_catalogue(self.engine)
        names = [v for _, v in available]
        gr.Markdown("Upload a **CSV** (a header row with a `prompt` column; optional `id`, `category`, "
                    "`reference`, `chat`) or **JSONL** (one `{\"prompt\": …}` object per line, or Spec-Bench "
                    "`{\"question_id\", \"category\", \"turns\"}`). Every row is checked; nothing is stored "
                    "unless all rows are valid.")
        with gr.Row():
            upload = gr.File(label="Eval set (.csv / .jsonl)", file_types=[".csv", ".jsonl", ".json"],
                             type="filepath", elem_id="pd-upload", scale=1)
            with gr.Column(scale=2):
                upload_msg = gr.Markdown("", elem_id="pd-upload-msg")
                preview = gr.Dataframe(preview_frame_empty(), label="Preview (first rows)", interactive=False,
                                       wrap=True, elem_id="pd-preview")
        with gr.Row():
            source = gr.Dropdown(self.source_choices(), label="Eval set or built-in suite", scale=2, allow_custom_value=True,
                                 elem_id="pd-source")
            strategies = gr.CheckboxGroup(available, value=[n for n in ("ar", "pld") if n in names] or names[:1],
                                          label="Strategies (ar always runs: it is the reference)", scale=3)
        with gr.Row():
            max_new = gr.Slider(1, 1024, value=64, step=1, label="Max new tokens", elem_id="pd-bench-max-new")
            repeats = gr.Slider(1, 10, value=1, step=1, label="Repeats")
            limit = gr.Number(0, precision=0, minimum=0, label="Only the first N prompts (0 = all)")
        with gr.Row():
            run_btn = gr.Button("Run benchmark", variant="primary", elem_id="pd-bench-run")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="pd-bench-stop")
        bench_msg = gr.Markdown("", elem_id="pd-bench-msg")
        last_run = gr.State(None)          # the run just finished: the button below opens it in the Dashboard
        open_btn = gr.Button("Open this run in the Dashboard", visible=False, elem_id="pd-bench-open", size="sm")
        from . import charts
        results = gr.Dataframe(charts.summary_frame([]), label="Results (per category and strategy)",
                               interactive=False, wrap=True, elem_id="pd-bench-results",
                               column_widths=charts.SUMMARY_WIDTHS)
        with gr.Row():
            unfinished = gr.Dropdown(self.resumable(), label="Unfinished runs", scale=3, allow_custom_value=True, elem_id="pd-unfinished")
            resume_btn = gr.Button("Resume", scale=1, elem_id="pd-resume")
            refresh_btn = gr.Button("Refresh lists", scale=1)

        upload.upload(self.upload, [upload], [upload_msg, preview, source], api_name="upload_evalset",
                      concurrency_limit=None)
        run_ev = run_btn.click(self.run, [source, strategies, max_new, repeats, limit],
                               [bench_msg, results, unfinished, last_run], api_name="run_bench",
                               concurrency_id="engine", concurrency_limit=1)
        resume_ev = resume_btn.click(self.resume, [unfinished], [bench_msg, results, unfinished, last_run],
                                     api_name="resume_bench", concurrency_id="engine", concurrency_limit=1)
        stop_btn.click(self.stop, None, [bench_msg], api_name="stop_bench", concurrency_limit=None)
        refresh_btn.click(self.refresh, None, [source, unfinished], api_name="refresh_evalsets",
                          concurrency_limit=None)
        return {"upload": upload, "source": source, "unfinished": unfinished, "refresh": self.refresh,
                "lists": [source, unfinished], "ended": [run_ev, resume_ev], "last_run": last_run,
                "open_button": open_btn}
