"""The results store: runs, eval sets and their items, and results.

SQLAlchemy 2 ORM on any SQLAlchemy URL; by default a SQLite file at `data/paradec.db` (or `$PARADEC_DB`)
in WAL mode with a busy timeout and foreign keys on, so a dashboard can read while a benchmark writes.

Every result is written in its own transaction as soon as it exists, so an interrupted run keeps all it
finished; the unique key (run_id, item_key, strategy, repeat, turn) makes a duplicate row impossible, and
`done_keys` tells a resumed run what to skip. Each result keeps the parameters its strategy ran with
(`params`, so a parameter sweep can be charted) and free facts about its item (`meta`, e.g. input length);
a database made by an older paradec gains such new columns when opened, and its results' quality is read in
today's schema (`paradec.quality.normalise`, in `_result_dict`: the file is not rewritten). An eval set and all its items are saved
in one transaction: all or nothing. The store knows nothing about torch; all queries are parameterised (ORM /
bound values).
"""
from __future__ import annotations

import os
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint,
                        create_engine, event, func, inspect, select, update)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, sessionmaker
from sqlalchemy.pool import StaticPool

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DB = ROOT / "data" / "paradec.db"

RUN_KINDS = ("race", "bench", "eval", "longcontext")
RUN_STATUSES = ("running", "finished", "interrupted", "failed")
EVAL_FORMATS = ("csv", "jsonl", "specbench")


class StoreError(Exception):
    """A store operation could not be done; the message says which and why."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="running", index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    model: Mapped[str] = mapped_column(String(500), default="")
    device: Mapped[str] = mapped_column(String(64), default="")
    dtype: Mapped[str] = mapped_column(String(32), default="")
    environment: Mapped[dict] = mapped_column(JSON, default=dict)
    strategies: Mapped[list] = mapped_column(JSON, default=list)
    settings: Mapped[dict] = mapped_column(JSON, default=dict)
    eval_set_id: Mapped[int | None] = mapped_column(ForeignKey("eval_sets.id", ondelete="SET NULL"), index=True)
    host: Mapped[str] = mapped_column(String(255), default="")
    pid: Mapped[int | None] = mapped_column(Integer)
    process_tag: Mapped[str] = mapped_column(String(100), default="")
    error: Mapped[str | None] = mapped_column(Text)

    results: Mapped[list["Result"]] = relationship(back_populates="run", cascade="all, delete-orphan",
                                                   passive_deletes=True)


class EvalSetRow(Base):
    __tablename__ = "eval_sets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    source_filename: Mapped[str] = mapped_column(String(500), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    format: Mapped[str] = mapped_column(String(16))
    n_items: Mapped[int] = mapped_column(Integer, default=0)

    items: Mapped[list["EvalItemRow"]] = relationship(back_populates="eval_set", cascade="all, delete-orphan",
                                                      passive_deletes=True, order_by="EvalItemRow.position")


class EvalItemRow(Base):
    __tablename__ = "eval_items"
    __table_args__ = (UniqueConstraint("eval_set_id", "item_id", name="uq_eval_item"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    eval_set_id: Mapped[int] = mapped_column(ForeignKey("eval_sets.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    item_id: Mapped[str] = mapped_column(String(200))
    category: Mapped[str] = mapped_column(String(100), default="general")
    prompt: Mapped[str] = mapped_column(Text)                       # the first user turn
    turns: Mapped[list] = mapped_column(JSON)                       # every user turn
    reference: Mapped[str | None] = mapped_column(Text)             # reference answer to the first turn
    references: Mapped[list | None] = mapped_column(JSON(none_as_null=True))  # one per turn (None where absent)
    chat: Mapped[bool] = mapped_column(Boolean, default=True)      # False: raw completion, no chat template
    meta: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))

    eval_set: Mapped[EvalSetRow] = relationship(back_populates="items")


class Result(Base):
    __tablename__ = "results"
    __table_args__ = (UniqueConstraint("run_id", "item_key", "strategy", "repeat", "turn", name="uq_result"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    item_key: Mapped[str] = mapped_column(String(200))
    category: Mapped[str] = mapped_column(String(100), default="")
    strategy: Mapped[str] = mapped_column(String(100))
    repeat: Mapped[int] = mapped_column(Integer, default=0)
    turn: Mapped[int] = mapped_column(Integer, default=0)
    prompt: Mapped[str] = mapped_column(Text, default="")
    text: Mapped[str] = mapped_column(Text, default="")
    token_ids: Mapped[list | None] = mapped_column(JSON(none_as_null=True))
    n_tokens: Mapped[int] = mapped_column(Integer, default=0)
    forward_passes: Mapped[int] = mapped_column(Integer, default=0)
    draft_passes: Mapped[int] = mapped_column(Integer, default=0)
    drafted: Mapped[int] = mapped_column(Integer, default=0)
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    tpot_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_pass: Mapped[float | None] = mapped_column(Float)
    itl: Mapped[list | None] = mapped_column(JSON(none_as_null=True))
    quality: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    params: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))    # the strategy's parameters as run
    meta: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))      # facts about the item (length, depth)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    run: Mapped[Run] = relationship(back_populates="results")


RESULT_FIELDS = {c.name for c in Result.__table__.columns} - {"id", "run_id", "created_at"}
RUN_FIELDS = {c.name for c in Run.__table__.columns} - {"id"}


def default_url() -> str:
    return os.environ.get("PARADEC_DB") or f"sqlite:///{DEFAULT_DB}"


def _normalise_url(url: str | os.PathLike | None) -> str:
    url = str(url) if url is not None else default_url()
    if "://" not in url:            # a bare file path
        url = f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def _safe_url(url: str) -> str:
    """The URL with any password hidden (for messages)."""
    try:
        from sqlalchemy.engine import make_url
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not even a URL
        return repr(url.split("@")[-1][:200])


def _row_dict(obj) -> dict:
    return {c.name: getattr(obj, c.name) for c in obj.__table__.columns}


def _result_dict(res: "Result") -> dict:
    """A stored result as a dict, its quality in today's schema whichever paradec wrote it (the one place old
    rows are read into the new form: `paradec.quality.normalise`; the database itself is never rewritten)."""
    from .quality import normalise
    d = _row_dict(res)
    d["quality"] = normalise(d["quality"])
    return d


def run_params(settings: dict | None, strategy: str) -> dict | None:
    """The parameters a run's settings name for one strategy: `{"bench": {"params": {strategy: {...}}}}` (bench
    and eval runs) or `{"params": {strategy: {...}}}` (races); None when they name none."""
    if not isinstance(settings, dict):
        return None
    for holder in (settings.get("bench"), settings):
        params = holder.get("params") if isinstance(holder, dict) else None
        if isinstance(params, dict) and isinstance(params.get(strategy), dict):
            return dict(params[strategy])
    return None


def _process_tag(pid: int) -> str:
    """Identifies a process beyond its pid (pids are reused: a container's app is often pid 1 every time):
    the boot id and the process start time where /proc has them (Linux), else ''."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
        return f"{boot}:{stat.rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return ""


def _pid_alive(pid: int | None, tag: str | None = None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not tag or _process_tag(pid) in ("", tag)


_CLAIM_LOCK = threading.Lock()
_CLAIMED: set[tuple[str, int]] = set()     # (store url, run id) resumed by this process and not finished yet


class Store:
    """All database access goes through here. Thread-safe: every method opens its own session."""

    def __init__(self, url: str | os.PathLike | None = None, echo: bool = False):
        """Opens (and creates) the database; StoreError, with the reason in one line, when it cannot."""
        try:
            self._open(url, echo)
        except (SQLAlchemyError, OSError, ValueError, ImportError) as e:
            shown = _safe_url(_normalise_url(url))
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StoreError(f"the database {shown} cannot be opened: {reason[:300]}") from None

    def _open(self, url, echo: bool) -> None:
        self.url = _normalise_url(url)
        kw: dict[str, Any] = {"echo": echo}
        self.is_sqlite = self.url.startswith("sqlite")
        if self.is_sqlite:
            kw["connect_args"] = {"check_same_thread": False, "timeout": 30}
            path = self.url.split("///", 1)[1] if "///" in self.url else ""
            if path and path != ":memory:" and not path.startswith("file:"):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            else:                   # in-memory: one shared connection, or every session sees a new database
                kw["poolclass"] = StaticPool
        self.engine = create_engine(self.url, **kw)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._add_missing_columns()
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def _add_missing_columns(self) -> None:
        """A database made by an older paradec gains the columns added since (nullable; names from our schema)."""
        insp = inspect(self.engine)
        with self.engine.begin() as c:
            for table in Base.metadata.sorted_tables:
                have = {col["name"] for col in insp.get_columns(table.name)}
                for col in table.columns:
                    if col.name not in have:
                        kind = col.type.compile(dialect=self.engine.dialect)
                        c.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}')

    def session(self) -> Session:
        return self._sessions()

    def close(self) -> None:
        self.engine.dispose()

    def journal_mode(self) -> str | None:
        """SQLite's journal mode ('wal' normally); None on other databases."""
        if not self.is_sqlite:
            return None
        with self.engine.connect() as c:
            return str(c.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()

    def counts(self) -> dict[str, int]:
        """Row count of every table (for checks and the UI)."""
        with self.session() as s:
            return {m.__tablename__: s.scalar(select(func.count()).select_from(m))
                    for m in (Run, EvalSetRow, EvalItemRow, Result)}

    # ------------------------------------------------------------------ runs
    def create_run(self, kind: str, *, name: str = "", model: str = "", device: str = "", dtype: str = "",
                   environment: dict | None = None, strategies: list | None = None, settings: dict | None = None,
                   eval_set_id: int | None = None) -> int:
        if kind not in RUN_KINDS:
            raise StoreError(f"run kind must be one of {', '.join(RUN_KINDS)}, got {kind!r}")
        run = Run(kind=kind, status="running", name=name, model=model, device=device, dtype=dtype,
                  environment=environment or {}, strategies=list(strategies or []), settings=settings or {},
                  eval_set_id=eval_set_id, host=socket.gethostname(), pid=os.getpid(),
                  process_tag=_process_tag(os.getpid()))
        with self.session() as s:
            s.add(run)
            try:
                s.commit()
            except IntegrityError as e:
                s.rollback()
                raise StoreError(f"the run could not be created: eval set {eval_set_id} does not exist") from e
            return run.id

    def finish_run(self, run_id: int, status: str = "finished", error: str | None = None) -> None:
        if status not in RUN_STATUSES or status == "running":
            raise StoreError(f"a run finishes as finished, interrupted or failed, not {status!r}")
        _CLAIMED.discard((self.url, run_id))
        with self.session() as s:
            n = s.execute(update(Run).where(Run.id == run_id)
                          .values(status=status, error=error, finished_at=_now())).rowcount
            s.commit()
        if not n:
            raise StoreError(f"there is no run {run_id}")

    def resume_run(self, run_id: int) -> dict:
        """Claim a run for this process (status 'running', our host and pid) and return it; its stored results
        stay. Only one resumer wins: StoreError when the run is being run right now, by a live process on this
        host, by another resume in this process, or by a process on another host (which cannot be checked from
        here); a compare-and-set on (status, pid) settles two resumes that start at the same moment."""
        me, host = os.getpid(), socket.gethostname()
        with _CLAIM_LOCK, self.session() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise StoreError(f"there is no run {run_id}")
            if run.status == "running":
                busy = ((run.host and run.host != host) or (run.pid == me and (self.url, run_id) in _CLAIMED)
                        or (run.pid not in (None, me) and _pid_alive(run.pid, run.process_tag)))
                if busy:
                    where = f"process {run.pid} on {run.host}" if run.host else f"process {run.pid}"
                    raise StoreError(f"run {run_id} is being run right now ({where}); wait for it to finish "
                                     "(or stop it) before resuming it")
            n = s.execute(update(Run).where(Run.id == run_id, Run.status == run.status,
                                            Run.pid.is_(None) if run.pid is None else Run.pid == run.pid)
                          .values(status="running", error=None, finished_at=None, host=host, pid=me,
                                  process_tag=_process_tag(me))).rowcount
            s.commit()
            if not n:
                raise StoreError(f"run {run_id} is being resumed by another process")
            _CLAIMED.add((self.url, run_id))
            s.expire_all()
            return _row_dict(s.get(Run, run_id))

    def update_run(self, run_id: int, **fields) -> None:
        bad = set(fields) - (RUN_FIELDS - {"created_at"})
        if bad:
            raise StoreError(f"unknown run field(s): {', '.join(sorted(bad))}")
        with self.session() as s:
            n = s.execute(update(Run).where(Run.id == run_id).values(**fields)).rowcount
            s.commit()
        if not n:
            raise StoreError(f"there is no run {run_id}")

    def get_run(self, run_id: int) -> dict | None:
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is None:
                return None
            d = _row_dict(run)
            d["n_results"] = s.scalar(select(func.count()).select_from(Result).where(Result.run_id == run_id))
            return d

    def list_runs(self, kind: str | None = None, status: str | None = None, limit: int | None = None) -> list[dict]:
        """Newest first, each with its number of results."""
        counts = (select(Result.run_id, func.count().label("n")).group_by(Result.run_id).subquery())
        q = (select(Run, func.coalesce(counts.c.n, 0)).outerjoin(counts, counts.c.run_id == Run.id)
             .order_by(Run.id.desc()))
        if kind:
            q = q.where(Run.kind == kind)
        if status:
            q = q.where(Run.status == status)
        if limit:
            q = q.limit(limit)
        with self.session() as s:
            return [dict(_row_dict(r), n_results=n) for r, n in s.execute(q).all()]

    def delete_run(self, run_id: int) -> None:
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is not None:
                s.delete(run)
                s.commit()

    def mark_interrupted_runs(self, all_hosts: bool = False) -> list[int]:
        """Runs left 'running' by a process that no longer exists become 'interrupted'. Returns their ids.

        A run started on another host is left alone (its process cannot be checked from here) unless
        `all_hosts` is set.
        """
        host = socket.gethostname()
        with self.session() as s:
            ids = [r.id for r in s.scalars(select(Run).where(Run.status == "running"))
                   if (r.host == host and not _pid_alive(r.pid, r.process_tag)) or (all_hosts and r.host != host)
                   or (r.host == host and r.pid is None)]
            if ids:
                s.execute(update(Run).where(Run.id.in_(ids))
                          .values(status="interrupted", finished_at=_now()))
                s.commit()
        return ids

    # ------------------------------------------------------------------ results
    def add_result(self, run_id: int, **fields) -> int:
        """Store one result at once, in its own transaction; returns its id.

        Required: item_key, strategy. A row with the same (run_id, item_key, strategy, repeat, turn) is
        never duplicated: if one exists its id is returned unchanged - except that a stored row with an
        error is replaced by a new result without one (so a resumed run retries failures).
        """
        bad = set(fields) - RESULT_FIELDS
        if bad:
            raise StoreError(f"unknown result field(s): {', '.join(sorted(bad))}")
        for k in ("item_key", "strategy"):
            if not fields.get(k) and fields.get(k) != 0:
                raise StoreError(f"a result needs {k}")
        fields["item_key"] = str(fields["item_key"])
        fields.setdefault("repeat", 0)
        fields.setdefault("turn", 0)
        key = (run_id, fields["item_key"], fields["strategy"], int(fields["repeat"]), int(fields["turn"]))
        for attempt in range(2):
            with self.session() as s:
                existing = self._find_result(s, *key)
                if existing is not None:
                    if existing.error and not fields.get("error"):
                        existing.error = None
                        for k, v in fields.items():
                            setattr(existing, k, v)
                        existing.created_at = _now()
                        s.commit()
                    return existing.id
                row = Result(run_id=run_id, **fields)
                s.add(row)
                try:
                    s.commit()
                    return row.id
                except IntegrityError as e:
                    s.rollback()
                    if s.get(Run, run_id) is None:
                        raise StoreError(f"cannot store a result: there is no run {run_id}") from e
                    if attempt:     # lost a race to another writer twice: give up loudly
                        raise StoreError(f"result {key} could not be stored: {e.orig}") from e
        raise StoreError(f"result {key} could not be stored")   # pragma: no cover

    @staticmethod
    def _find_result(s: Session, run_id, item_key, strategy, repeat, turn) -> Result | None:
        return s.scalars(select(Result).where(Result.run_id == run_id, Result.item_key == item_key,
                                              Result.strategy == strategy, Result.repeat == repeat,
                                              Result.turn == turn)).first()

    def done_keys(self, run_id: int, include_errors: bool = False) -> set[tuple[str, str, int, int]]:
        """(item_key, strategy, repeat, turn) of the results already stored for a run (for --resume).
        Rows with an error are left out unless include_errors, so a resumed run retries them."""
        q = select(Result.item_key, Result.strategy, Result.repeat, Result.turn).where(Result.run_id == run_id)
        if not include_errors:
            q = q.where(Result.error.is_(None))
        with self.session() as s:
            return {tuple(r) for r in s.execute(q).all()}

    def get_result(self, run_id: int, item_key: str, strategy: str, repeat: int = 0, turn: int = 0) -> dict | None:
        """One stored result by its key (a resumed run reads the reference output it skips), or None."""
        with self.session() as s:
            r = self._find_result(s, run_id, str(item_key), strategy, int(repeat), int(turn))
            return _result_dict(r) if r is not None else None

    def get_results(self, run_id: int) -> list[dict]:
        with self.session() as s:
            return [_result_dict(r) for r in s.scalars(select(Result).where(Result.run_id == run_id)
                                                        .order_by(Result.id))]

    def results_dataframe(self, run_ids: Iterable[int] | int | None = None, *, kind: str | None = None,
                          strategies: Iterable[str] | None = None, categories: Iterable[str] | None = None,
                          eval_set_id: int | None = None, status: str | None = None, model: str | None = None,
                          include_errors: bool = True, light: bool = False):
        """One row per result, with the run's columns joined (run_name, run_kind, run_status, model, device,
        dtype, run_created_at, eval_set_id), each quality key spread into a `q_<key>` column and each meta key
        into an `m_<key>` column. `params` is the strategy's parameters as stored with the result; a result
        stored before paradec kept them gets the ones its run's settings name for its strategy (or None).
        `light` leaves out the bulky columns (text, token_ids, itl, prompt)."""
        import pandas as pd

        q = (select(Result, Run.name, Run.kind, Run.status, Run.model, Run.device, Run.dtype, Run.created_at,
                    Run.eval_set_id, Run.settings).join(Run, Result.run_id == Run.id)
             .order_by(Result.run_id, Result.id))
        if run_ids is not None:
            ids = [run_ids] if isinstance(run_ids, int) else list(run_ids)
            q = q.where(Result.run_id.in_(ids))
        if kind:
            q = q.where(Run.kind == kind)
        if status:
            q = q.where(Run.status == status)
        if model:
            q = q.where(Run.model == model)
        if eval_set_id is not None:
            q = q.where(Run.eval_set_id == eval_set_id)
        if strategies is not None:
            q = q.where(Result.strategy.in_(list(strategies)))
        if categories is not None:
            q = q.where(Result.category.in_(list(categories)))
        if not include_errors:
            q = q.where(Result.error.is_(None))
        bulky = {"text", "token_ids", "itl", "prompt"} if light else set()
        rows = []
        with self.session() as s:
            for res, rname, rkind, rstatus, rmodel, rdevice, rdtype, rcreated, rset, rsettings in s.execute(q).all():
                d = {k: v for k, v in _result_dict(res).items() if k not in bulky}
                d.update(run_name=rname, run_kind=rkind, run_status=rstatus, model=rmodel, device=rdevice,
                         dtype=rdtype, run_created_at=rcreated, eval_set_id=rset)
                if d.get("params") is None:
                    d["params"] = run_params(rsettings, res.strategy)
                for k, v in (d["quality"] or {}).items():
                    d[f"q_{k}"] = v
                for k, v in (res.meta or {}).items():
                    d[f"m_{k}"] = v
                rows.append(d)
        base_cols = [c for c in (["id", "run_id"] + sorted(RESULT_FIELDS) + ["created_at", "run_name", "run_kind",
                                 "run_status", "model", "device", "dtype", "run_created_at", "eval_set_id"])
                     if c not in bulky]
        df = pd.DataFrame(rows)
        if df.empty:
            return pd.DataFrame(columns=base_cols)
        return df

    # ------------------------------------------------------------------ eval sets
    def save_eval_set(self, parsed, name: str | None = None, source_filename: str | None = None) -> int:
        """Store a parsed `EvalSet` (from paradec.evalsets) and all its items in ONE transaction."""
        items = list(parsed.items)
        if not items:
            raise StoreError("an eval set needs at least one item")
        fmt = parsed.format
        if fmt not in EVAL_FORMATS:
            raise StoreError(f"eval set format must be one of {', '.join(EVAL_FORMATS)}, got {fmt!r}")
        row = EvalSetRow(name=name or parsed.name, format=fmt, n_items=len(items),
                         source_filename=source_filename or getattr(parsed, "source_filename", "") or "")
        for pos, it in enumerate(items):
            refs = list(it.references) if getattr(it, "references", None) else None
            row.items.append(EvalItemRow(
                position=pos, item_id=str(it.item_id), category=it.category or "general",
                prompt=it.turns[0], turns=list(it.turns),
                reference=getattr(it, "reference", None) if refs else None,     # text: a turn may list alternatives
                references=refs if refs and any(r is not None for r in refs) else None,
                chat=bool(getattr(it, "chat", True)), meta=getattr(it, "meta", None) or None))
        with self.session() as s:
            s.add(row)
            try:
                s.commit()
            except IntegrityError as e:
                s.rollback()
                raise StoreError(f"eval set {row.name!r} was not saved (nothing stored): {e.orig}") from e
            except Exception:
                s.rollback()
                raise
            return row.id

    def list_eval_sets(self) -> list[dict]:
        with self.session() as s:
            return [_row_dict(r) for r in s.scalars(select(EvalSetRow).order_by(EvalSetRow.id.desc()))]

    def get_eval_set(self, set_id: int) -> dict | None:
        with self.session() as s:
            r = s.get(EvalSetRow, set_id)
            return _row_dict(r) if r else None

    def get_eval_set_items(self, set_id: int) -> list[dict]:
        with self.session() as s:
            return [_row_dict(r) for r in s.scalars(select(EvalItemRow).where(EvalItemRow.eval_set_id == set_id)
                                                     .order_by(EvalItemRow.position))]

    def load_eval_set(self, set_id: int):
        """The stored set as a paradec.evalsets.EvalSet again (for running it)."""
        from .evalsets import EvalItem, EvalSet
        info = self.get_eval_set(set_id)
        if info is None:
            raise StoreError(f"there is no eval set {set_id}")
        items = [EvalItem(item_id=r["item_id"], category=r["category"], turns=list(r["turns"]),
                          references=list(r["references"]) if r["references"] else
                          ([r["reference"]] + [None] * (len(r["turns"]) - 1) if r["reference"] is not None else None),
                          chat=r["chat"], meta=r["meta"] or {})
                 for r in self.get_eval_set_items(set_id)]
        return EvalSet(name=info["name"], format=info["format"], items=items,
                       source_filename=info["source_filename"])

    def delete_eval_set(self, set_id: int) -> None:
        with self.session() as s:
            r = s.get(EvalSetRow, set_id)
            if r is not None:
                s.delete(r)
                s.commit()


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
