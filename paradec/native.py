"""paradec's own row-exact linear for x86 CPUs with AVX2 and FMA (paradec/csrc/rowlinear.cpp), built here; also a
few-row LoRA delta (`lora_add`).

Why. A decoding pass over T new tokens multiplies a (T, in) activation by every weight. On a CPU without AMX,
torch's float32 products for a few rows either read the weight more than once (F.linear) or give a row other
numbers depending on how many rows share its pass (the streamed W @ x^T form without its row plans; see
paradec/kernels.py), and neither reads less than 4 bytes per weight. This kernel:

- keeps each weight packed in blocks of 16 outputs, in bfloat16 when every weight is a bfloat16 number (a model
  loaded in float32 from a bfloat16 checkpoint, as the default model is: the packed copy is then exact, and the
  product is the float32 model's own), in float32 otherwise; a one-token pass reads half the bytes;
- multiplies each block with up to 6 rows at a time from cache, so the weight crosses memory once per pass;
- sums every output in one fixed order (k = 0 .. in-1 through fused multiply-adds, then the bias), whatever the
  row count, tile or thread: a row's numbers do not depend on the rows beside it, by construction (no probe, no
  plans), which is what lossless strategies need.

Measured on an AMD EPYC 7001 (Zen 1, AVX2, 2.0 GHz, 2 threads), (4864 x 896) projection, ms for 1 / 4 / 12 / 64
rows: this kernel with a bfloat16 copy 0.42 / 0.71 / 1.82 / 9.4; torch's F.linear 1.30 / 4.41 / 6.41 / 13.9; the
streamed W @ x^T 1.31 / 1.12 / 3.70 / 9.1 (without the row plans it needs to be exact). The LM head (151,936 x 896)
over one row 13.9 ms against 37.6 ms. Past about 4 rows that CPU's FMA throughput, not memory, sets the cost.

It also holds the gated adapters' LoRA deltas for a few rows (`lora_add`, paradec/adapters.py): LUD's, PTP's
pad slots in a bf16 pass, a sibling group's first and second products and the addition in one call on the
calling thread. Those are microseconds of work each, 96 groups a pass for Qwen2.5-0.5B; as two oneDNN calls
each, every one a parallel region, they cost 11-17 ms of a 63 ms pass on an AMX Xeon.

How it is built: on first use, g++ compiles the source into a shared library under the user's cache
(`PARADEC_NATIVE_DIR`, default ~/.cache/paradec/native), named by the source's hash, about 2 s; ctypes loads it.
Its OpenMP runtime is torch's own (the library asks for libgomp.so.1, which torch has loaded already), so both
share one pool of threads. `available()` is False, with `why()` saying why, on a CPU without AVX2/FMA, without g++,
or when the build fails; `PARADEC_NATIVE=0` turns it off (the streamed float32 linears take over).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "rowlinear.cpp"
BLOCK = 16
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
_LOCK = threading.Lock()
_STATE: dict = {}


def _build_dir() -> Path:
    return Path(os.environ.get("PARADEC_NATIVE_DIR") or Path.home() / ".cache" / "paradec" / "native")


def _load() -> ctypes.CDLL | None:
    if os.environ.get("PARADEC_NATIVE", "1") == "0":
        _STATE["why"] = "turned off by PARADEC_NATIVE=0"
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        _STATE["why"] = f"needs an x86-64 CPU (this is {platform.machine()})"
        return None
    from .engine import cpu_flags
    missing = {"avx2", "fma"} - cpu_flags()
    if missing:
        _STATE["why"] = f"this CPU lacks {', '.join(sorted(missing))}"
        return None
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        _STATE["why"] = "no C++ compiler (g++) on PATH"
        return None
    src = SOURCE.read_bytes()
    tag = hashlib.sha256(src + " ".join(FLAGS).encode()).hexdigest()[:16]
    lib = _build_dir() / f"rowlinear-{tag}.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
        os.close(fd)
        try:
            r = subprocess.run([cxx, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                _STATE["why"] = f"building {SOURCE.name} failed: {r.stderr.strip()[-400:]}"
                return None
            os.replace(tmp, lib)                   # atomic: a concurrent builder finds a whole library or none
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        dll = ctypes.CDLL(str(lib))
    except OSError as e:
        _STATE["why"] = f"loading {lib} failed: {e}"
        return None
    args = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_int]
    for fn in (dll.pd_linear_bf16, dll.pd_linear_f32):
        fn.argtypes, fn.restype = args, None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    dll.pd_lora_bf16.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, ptr, ptr, ptr, i64]
    dll.pd_lora_bf16.restype = ctypes.c_int
    return dll


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, built on first call; None where it cannot run (`why`)."""
    if "lib" in _STATE:                       # every linear of every pass asks: no lock once it is known
        return _STATE["lib"]
    with _LOCK:
        if "lib" not in _STATE:
            _STATE["lib"] = _load()
        return _STATE["lib"]


def available() -> bool:
    return library() is not None


def why() -> str | None:
    """Why the kernel is not available (None when it is)."""
    return None if available() else _STATE.get("why")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A (out, in) weight in the kernel's layout: blocks of 16 outputs, k-major, the last block padded with zero
    rows; bfloat16 when that is exact for every weight (or the weight is bfloat16), float32 otherwise."""
    w = weight.detach()
    if w.dtype != torch.bfloat16:
        w = w.float()
        as_bf16 = w.to(torch.bfloat16)
        if torch.equal(as_bf16.float(), w):
            w = as_bf16
    n, k = w.shape
    blocks = -(-n // BLOCK)
    if blocks * BLOCK != n:
        w = torch.cat([w, w.new_zeros(blocks * BLOCK - n, k)])
    return w.reshape(blocks, BLOCK, k).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None,
           threads: int | None = None) -> torch.Tensor:
    """x (..., in) times the packed weight (+ bias), in float32, returned in x's dtype. Row-exact: each row's
    outputs are the same whatever else the pass holds."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"paradec's native linear is not available: {why()}")
    k = x.shape[-1]
    if packed.dim() != 3 or packed.shape[1] != k or packed.shape[0] * BLOCK < out_features:
        raise ValueError(f"packed weight {tuple(packed.shape)} does not fit an input of width {k} and "
                         f"{out_features} outputs")
    x2 = x.reshape(-1, k).float().contiguous()
    m = x2.shape[0]
    y = torch.empty(m, out_features, dtype=torch.float32)
    b = None if bias is None else bias.detach().float().contiguous()
    if m:
        fn = lib.pd_linear_bf16 if packed.dtype == torch.bfloat16 else lib.pd_linear_f32
        fn(x2.data_ptr(), m, k, packed.data_ptr(), out_features, None if b is None else b.data_ptr(),
           y.data_ptr(), int(threads or torch.get_num_threads()))
    return y.to(x.dtype).view(*x.shape[:-1], out_features)


LORA_ROWS = 32         # rows `lora_add` takes (the pad slots of a decoding pass; more go through oneDNN)


class LoraPack:
    """`lora_add`'s operands for LoRA pairs [(A (r_s, in), B (out_s, r_s), scale)] that read one input and write
    consecutive output columns, in bfloat16: the A's stacked (r, in); each scale * B^T in blocks of 16 outputs, a
    block r_s x 16 contiguous (the last one padded with zeros), the members one after another; 4 int64 per member
    (its first row of the stack, r_s, its first output column, out_s)."""

    def __init__(self, pairs):
        self.a = torch.cat([p[0].detach() for p in pairs]).to(torch.bfloat16).contiguous()
        blocks, seg, r0, o0 = [], [], 0, 0
        for a, b, scale in pairs:
            rs, os = a.shape[0], b.shape[0]
            bt = b.detach().float().t() * scale                              # (rs, os)
            pad = -os % BLOCK
            if pad:
                bt = torch.cat([bt, bt.new_zeros(rs, pad)], 1)
            blocks.append(bt.reshape(rs, -1, BLOCK).transpose(0, 1).reshape(-1))
            seg += [r0, rs, o0, os]
            r0, o0 = r0 + rs, o0 + os
        self.bt = torch.cat(blocks).to(torch.bfloat16).contiguous()
        self.seg = torch.tensor(seg, dtype=torch.int64)
        self.width, self.rank, self.outputs, self.members = self.a.shape[1], r0, o0, len(pairs)
        self.ptrs = (self.a.data_ptr(), self.rank, self.members, self.seg.data_ptr(), self.bt.data_ptr())


def lora_add(x: torch.Tensor, pack: LoraPack, y: torch.Tensor) -> bool:
    """y += the LoRA deltas of the pack's pairs for the rows x (M, in), in place, y (M, their outputs); both bf16
    with contiguous rows, 1 <= M <= LORA_ROWS. One call on this thread, float32 inside, the sum rounded to bf16
    once. False (nothing done) where the kernel cannot take it."""
    lib = library()
    M = x.shape[0]
    if (lib is None or not 1 <= M <= LORA_ROWS or x.dtype != torch.bfloat16 or y.dtype != torch.bfloat16
            or x.dim() != 2 or y.dim() != 2 or x.stride(1) != 1 or y.stride(1) != 1 or x.shape[1] != pack.width
            or y.shape[0] != M or y.shape[1] != pack.outputs or x.device.type != "cpu"):
        return False
    a, r, n, seg, bt = pack.ptrs
    return lib.pd_lora_bf16(x.data_ptr(), x.stride(0), M, pack.width, a, r, n, seg, bt, y.data_ptr(), y.stride(0)) == 0
