"""paradec web app: Arena (strategies racing on one prompt), Eval sets (upload, benchmark, resume), Dashboard.

    python app.py [--model M] [--device D] [--dtype T] [--db URL] [--host 127.0.0.1] [--port 7860]

Binds 127.0.0.1 unless --host says otherwise. Set PARADEC_AUTH="user:password" to require a login. All
sessions share one engine: races and benchmarks wait in one queue (the page shows the queue position).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402

from paradec.evalsets import MAX_BYTES  # noqa: E402

CSS = """
.pd-slot { min-width: 220px; }
.pd-col .pd-text::-webkit-scrollbar { width: 6px; }
"""


def theme():
    # system fonts only: the app must work with no network (the default theme fetches Google fonts)
    return gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                          font_mono=["ui-monospace", "SFMono-Regular", "monospace"])


def build_app(engine, store) -> gr.Blocks:
    """The whole app on one engine and one store (tests launch it with prevent_thread_lock=True)."""
    from paradec.ui import Arena, Dashboard, EvalSetsTab

    store.mark_interrupted_runs()
    arena, evals, dash = Arena(engine, store), EvalSetsTab(engine, store), Dashboard(store)
    desc = engine.describe()
    with gr.Blocks(title="paradec", analytics_enabled=False) as demo:
        gr.Markdown(f"## paradec — parallel decoding workbench\nModel **{desc['model']}** · {desc['device']} · "
                    f"{desc['dtype']} · {desc['parameters']:,} parameters")
        with gr.Tabs() as tabs:
            with gr.Tab("Arena", id="arena"):
                a = arena.build()
            with gr.Tab("Eval sets", id="evals") as evals_tab:
                e = evals.build()
            with gr.Tab("Dashboard", id="dashboard") as dash_tab:
                d = dash.build()
        evals_tab.select(e["refresh"], None, e["lists"], api_visibility="undocumented", concurrency_limit=None)
        # the Dashboard draws the latest runs when the page loads, when its tab opens and when a run ends
        open_fn, open_in, open_out = d["open"]
        for trigger in (dash_tab.select, demo.load):
            trigger(open_fn, open_in, open_out, api_visibility="undocumented", concurrency_limit=None,
                    show_progress="hidden")
        for ev in a["ended"] + e["ended"]:
            ev.then(open_fn, open_in, open_out, api_visibility="undocumented", concurrency_limit=None,
                    show_progress="hidden")
        for ev in e["ended"]:       # a finished benchmark offers its Dashboard view
            ev.then(lambda rid: gr.update(visible=rid is not None, value=f"Open run #{rid} in the Dashboard"),
                    [e["last_run"]], [e["open_button"]], api_visibility="undocumented", queue=False)
        e["open_button"].click(
            lambda rid: (gr.Tabs(selected="dashboard"), gr.update(value=[rid] if rid is not None else []),
                         gr.update(value="mine"), True),
            [e["last_run"]], [tabs, d["runs"], d["source"], d["picked"]], api_visibility="undocumented",
            queue=False).then(open_fn, open_in, open_out, api_visibility="undocumented", concurrency_limit=None,
                              show_progress="hidden")
        demo.unload(arena.unload)
    demo.queue(default_concurrency_limit=1)
    return demo


def parse_auth(value: str | None):
    """PARADEC_AUTH='user:password' -> ('user', 'password'); empty -> None."""
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise SystemExit("PARADEC_AUTH must look like user:password")
    return (user, password)


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = 7860, auth=None,
           prevent_thread_lock: bool = False, quiet: bool = False):
    return demo.launch(server_name=host, server_port=port, auth=auth, max_file_size=MAX_BYTES,
                       prevent_thread_lock=prevent_thread_lock, show_error=True, quiet=quiet, theme=theme(),
                       css=CSS, ssr_mode=False, footer_links=["api"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python app.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="local model folder, hub id, or paradec-tiny (default: Qwen2.5-Coder-0.5B-Instruct, provisioned on first use)")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, mps")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--db", help="SQLAlchemy URL or SQLite file (default $PARADEC_DB or data/paradec.db)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model folder")
    p.add_argument("--engine", metavar="URL", help="use a remote engine: `python -m paradec serve` on a GPU host, "
                   "or any OpenAI-compatible server (vLLM, SGLang, TGI); timings are then client-side")
    p.add_argument("--engine-token", help="bearer token for --engine (default $PARADEC_TOKEN)")
    p.add_argument("--random-tiny", action="store_true", help=argparse.SUPPRESS)   # tests and load tests
    args = p.parse_args(argv)

    from paradec.engine import Engine, ModelError
    from paradec.store import Store
    auth = parse_auth(os.environ.get("PARADEC_AUTH"))
    if args.random_tiny:
        from paradec.testing import random_tiny_engine
        engine = random_tiny_engine(0)
    elif args.engine:
        import httpx

        from paradec.remote import RemoteEngine, RemoteError
        try:
            engine = RemoteEngine(args.engine, token=args.engine_token or os.environ.get("PARADEC_TOKEN"),
                                  model=args.model)
            engine.describe()
        except (RemoteError, ValueError, httpx.HTTPError) as e:
            print(f"error: the engine at {args.engine} could not be used: {e}", file=sys.stderr)
            return 2
    else:
        try:
            engine = Engine.load(args.model, device=args.device, dtype=args.dtype,
                                 trust_remote_code=args.trust_remote_code)
        except ModelError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if isinstance(engine, Engine):
        from paradec.strategies import preload
        print("paradec: loading drafts and timing passes (once)", file=sys.stderr, flush=True)
        try:
            preload(engine)
        except ModelError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    store = Store(args.db)
    demo = build_app(engine, store)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not auth:
        print(f"warning: listening on {args.host} without a login; set PARADEC_AUTH=user:password",
              file=sys.stderr)
    launch(demo, args.host, args.port, auth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
