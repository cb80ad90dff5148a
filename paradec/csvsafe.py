"""CSV files that are safe to open in a spreadsheet, one file per request.

Every CSV paradec writes goes through `write_csv`. A text cell that starts with `=`, `+`, `-`, `@`, a tab or a
carriage return would be read by Excel, LibreOffice or Google Sheets as a formula (`=HYPERLINK(...)`,
`+cmd|' /C calc'!A0`): such cells get a leading apostrophe, as OWASP's CSV-injection guidance and
spreadsheet-safe exporters do. Numbers are written as numbers (a negative figure is not text and is left alone).

Each call writes into a fresh private folder under `folder`, so concurrent sessions never overwrite each
other's export; folders older than `keep_s` are removed on the way.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralise(v):
    """A cell value that no spreadsheet reads as a formula."""
    if isinstance(v, str) and v.startswith(FORMULA_START):
        return "'" + v
    return v


def safe_frame(df):
    """A copy of the DataFrame with every text cell (and column name) neutralised."""
    out = df.copy()
    from pandas.api.types import is_bool_dtype, is_numeric_dtype
    for c in out.columns:
        if not (is_numeric_dtype(out[c]) or is_bool_dtype(out[c])):   # text, categorical, mixed: every cell
            out[c] = out[c].astype(object).map(neutralise)
    out.columns = [neutralise(str(c)) for c in out.columns]
    return out


def write_csv(df, folder, name: str = "paradec-results.csv", keep_s: float = 3600.0) -> Path:
    """Write `df` (neutralised) to a new file `folder/<private dir>/name`; returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in folder.glob("export-*"):
        try:
            if now - old.stat().st_mtime > keep_s:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    path = Path(tempfile.mkdtemp(prefix="export-", dir=folder)) / name
    safe_frame(df).to_csv(path, index=False, lineterminator="\r\n")   # RFC 4180: a CR or LF in a cell is quoted
    return path
