"""Load test of the web app: N concurrent gradio_client sessions, each racing three strategies.

    python evals/load_app.py [--url http://127.0.0.1:7860/] [--clients 8] [--max-new-tokens 48] [--timeout 300]
                             [--strategies ar,pld,lookahead | a,b,c,d,...]

With more than three strategies, session i races a window of three of them, rotating, so the sessions together
put every strategy in the mix.

Without --url it starts `python app.py --random-tiny` on a free 127.0.0.1 port with a temporary database and
stops it afterwards. All sessions share one engine, so races queue (one at a time); a session's latency is
submit -> last frame, including its wait in the queue. Prints one JSON line: completed count, errors (a
session that raised or timed out), lost (a session whose last frame was not a finished race), per-client
latency, time to the first streamed token (submit -> first frame with a token), and their p50/max; and
lane_errors: columns of a finished race that ended in an error (a strategy that failed under load).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_app(db: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--random-tiny", "--port", str(port), "--db", db],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx
    url = f"http://127.0.0.1:{port}/"
    t0 = time.time()
    while time.time() - t0 < 180:
        if proc.poll() is not None:
            raise SystemExit("app.py exited before it served")
        try:
            httpx.get(url + "config", timeout=2)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit("app.py did not start within 180 s")


def _figures(frame) -> dict:
    """The race figures ({"finished", "lanes": ...}) among one frame's outputs, wherever the page puts them."""
    return next((x for x in (frame or []) if isinstance(x, dict) and "lanes" in x), {})


def one_client(url: str, i: int, strategies: list[str], max_new: int, deadline: float, out: list,
               barrier: threading.Barrier) -> None:
    from gradio_client import Client

    from paradec.ui.arena import default_params_json, param_strategies
    rec = {"client": i, "strategies": strategies, "completed": False, "latency_s": None, "first_token_s": None,
           "frames": 0, "error": None, "lane_errors": {}}
    try:
        c = Client(url, verbose=False, analytics_enabled=False)
        args = [f"Client {i}: explain Python decorators.", "chat", strategies, max_new, 0.0, 1.0, i, 0,
                *[default_params_json(n) for n in param_strategies()]]
        barrier.wait(120)          # every session connected: now all submit at once
        t0 = time.perf_counter()
        job = c.submit(*args, api_name="/race")
        seen = 0
        while time.time() < deadline:
            outs = job.outputs()
            for o in outs[seen:]:
                figs = _figures(o)
                if rec["first_token_s"] is None and any(v["tokens"] > 0 for v in figs.get("lanes", {}).values()):
                    rec["first_token_s"] = time.perf_counter() - t0
            seen = len(outs)
            if job.done():
                last = (job.outputs() or [None])[-1]
                figs = _figures(last)
                rec["completed"] = bool(figs.get("finished"))
                rec["lane_errors"] = {n: v.get("error") for n, v in figs.get("lanes", {}).items()
                                      if v.get("status") == "error" or v.get("error")}
                rec["latency_s"] = time.perf_counter() - t0
                break
            time.sleep(0.02)
        else:
            job.cancel()
            rec["error"] = "timed out"
        rec["frames"] = seen
    except Exception as e:  # noqa: BLE001 - a failed client is a result of the load test
        if not barrier.broken:
            barrier.abort()
        rec["error"] = f"{type(e).__name__}: {e}"
    out.append(rec)


PER_RACE = 3


def race_of(strategies: list[str], i: int) -> list[str]:
    """Session i's three strategies: all of them when there are at most three, else a rotating window."""
    if len(strategies) <= PER_RACE:
        return list(strategies)
    return [strategies[(i * PER_RACE + k) % len(strategies)] for k in range(PER_RACE)]


def _p50(vals):
    v = sorted(x for x in vals if x is not None)
    return None if not v else (v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running app (default: start app.py --random-tiny on 127.0.0.1)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--strategies", default="ar,pld,lookahead")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--timeout", type=float, default=300.0, help="overall bound in seconds")
    args = p.parse_args(argv)
    proc = None
    tmp = tempfile.TemporaryDirectory()
    url = args.url
    if not url:
        proc, url = start_app(os.path.join(tmp.name, "load.db"))
    try:
        strategies = args.strategies.split(",")
        deadline = time.time() + args.timeout
        out: list = []
        barrier = threading.Barrier(args.clients)
        threads = [threading.Thread(target=one_client,
                                    args=(url, i, race_of(strategies, i), args.max_new_tokens, deadline, out,
                                          barrier))
                   for i in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.timeout + 30)
        wall = time.perf_counter() - t0
        out.sort(key=lambda r: r["client"])
        lat = [r["latency_s"] for r in out if r["completed"]]
        ftt = [r["first_token_s"] for r in out if r["first_token_s"] is not None]
        report = {"clients": args.clients, "strategies": strategies, "max_new_tokens": args.max_new_tokens,
                  "completed": sum(r["completed"] for r in out),
                  "errors": sum(bool(r["error"]) for r in out),
                  "lane_errors": sum(len(r["lane_errors"]) for r in out),
                  "lost": sum(not r["completed"] and not r["error"] for r in out) + args.clients - len(out),
                  "wall_s_with_connect": round(wall, 3),
                  "latency_p50_s": _p50(lat), "latency_max_s": max(lat) if lat else None,
                  "first_token_p50_s": _p50(ftt), "first_token_max_s": max(ftt) if ftt else None,
                  "per_client": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in out]}
        print(json.dumps(report))
        return 0 if report["completed"] == args.clients and not report["lane_errors"] else 1
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
