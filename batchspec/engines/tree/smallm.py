"""Products of a few rows (a tree's nodes, a small batch) that read each weight once.

At 2-8 rows a product on this CPU should cost what one row's does: the weights stream from
memory either way, and 8 rows' multiply-adds take a fraction of that time. The libraries do
not get there: MKL's GEMM at 4 rows costs 1.5x its one-row product, oneDNN on weights packed
for it 1.26x inductor's one-row reductions at 4 rows and 1.7x at 8 (docs/trees.md, "What a
verify costs at batch 1"). This is the GEMM micro-kernel those products lack, for small M:
the weight matrix packed once into panels of 8 output columns ([out / 8, in, 8], streamed
front to back), three panels at a time for up to 4 rows (12 accumulator registers: enough
independent multiply-adds to hide their latency; each row's input broadcast from L1), the
weights prefetched ahead, and further passes of up to 4 rows reading a block of them again
from L1 while the next block is fetched.
Written in C with AVX2 and FMA, compiled at first use with the machine's C compiler into the
user's cache, and threaded over panels by the OpenMP runtime torch already loaded (one pool,
torch's thread count). Where it cannot be built (no compiler, no AVX2, not x86) ``load`` says
why once and the products stay oneDNN's.

The same library holds a decoder layer's work between its attention calls for those rows
(``layer_pre``, ``layer_post``: the norms, RoPE, residuals and SiLU around the products), which
``fewrows`` calls: the ops around the products cost more than the products' excess did.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from functools import cache
from pathlib import Path

import torch

from batchspec.io.temps import temp_name
from batchspec.models import user_cache

log = logging.getLogger(__name__)

PANEL = 8
"""Output columns per panel: one AVX2 register of float32."""
SOURCE = r"""
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#define BLOCK 64 /* k per block: 3 panels' weights of a block (6 KB) stay in L1 for rows 5- */

/* y[i][nb..nb+8) = sum_k x[i][k] * W[n][k], M <= 8 rows, one panel: the tail of a matrix whose
   panels do not come in threes. */
static inline __attribute__((always_inline)) void panel(
    const int M, const float *x, const float *p, float *y, int K, int N, int nb) {
  __m256 acc[8];
  for (int i = 0; i < M; i++) acc[i] = _mm256_setzero_ps();
  const float *w = p + (size_t)nb * K;
  for (int k = 0; k < K; k++) {
    __m256 wv = _mm256_loadu_ps(w + (size_t)k * 8);
    for (int i = 0; i < M; i++)
      acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)i * K + k), wv, acc[i]);
  }
  for (int i = 0; i < M; i++) _mm256_storeu_ps(y + (size_t)i * N + nb, acc[i]);
}

/* Three panels (24 columns from nb) for M <= 4 rows over k in [k0, k1), continuing the sums
   already in y when k0 > 0: 12 accumulators, so 12 multiply-add chains hide their latency
   where one panel's M chains did not, and 7 loads feed 12 multiply-adds (9 fed 8). With
   `fetch`, the weights are prefetched a cache line every other k (a non-temporal hint:
   nothing reads them again this step; a prefetch past the end never faults): 1 KB ahead when
   the pass streams them from memory (fetch 1), the next block's when the pass reads this
   block again from L1 (fetch 2), so that memory keeps streaming while rows 5-8 multiply. */
static inline __attribute__((always_inline)) void panels3(
    const int M, const float *x, const float *p, float *y, int K, int N, int nb, int k0,
    int k1, int fetch) {
  __m256 a0[4], a1[4], a2[4];
  for (int i = 0; i < M; i++) {
    float *yi = y + (size_t)i * N + nb;
    a0[i] = k0 ? _mm256_loadu_ps(yi) : _mm256_setzero_ps();
    a1[i] = k0 ? _mm256_loadu_ps(yi + 8) : _mm256_setzero_ps();
    a2[i] = k0 ? _mm256_loadu_ps(yi + 16) : _mm256_setzero_ps();
  }
  const float *w0 = p + (size_t)nb * K, *w1 = w0 + (size_t)8 * K, *w2 = w1 + (size_t)8 * K;
  for (int k = k0; k < k1; k++) {
    if (fetch && (k & 1) == 0) {
      const size_t ahead = fetch == 1 ? 256 : (size_t)BLOCK * 8;
      _mm_prefetch((const char *)(w0 + (size_t)k * 8 + ahead), _MM_HINT_NTA);
      _mm_prefetch((const char *)(w1 + (size_t)k * 8 + ahead), _MM_HINT_NTA);
      _mm_prefetch((const char *)(w2 + (size_t)k * 8 + ahead), _MM_HINT_NTA);
    }
    const __m256 v0 = _mm256_loadu_ps(w0 + (size_t)k * 8);
    const __m256 v1 = _mm256_loadu_ps(w1 + (size_t)k * 8);
    const __m256 v2 = _mm256_loadu_ps(w2 + (size_t)k * 8);
    for (int i = 0; i < M; i++) {
      const __m256 b = _mm256_broadcast_ss(x + (size_t)i * K + k);
      a0[i] = _mm256_fmadd_ps(b, v0, a0[i]);
      a1[i] = _mm256_fmadd_ps(b, v1, a1[i]);
      a2[i] = _mm256_fmadd_ps(b, v2, a2[i]);
    }
  }
  for (int i = 0; i < M; i++) {
    float *yi = y + (size_t)i * N + nb;
    _mm256_storeu_ps(yi, a0[i]);
    _mm256_storeu_ps(yi + 8, a1[i]);
    _mm256_storeu_ps(yi + 16, a2[i]);
  }
}

#define UP_TO_4(m, x, y, fetch) switch (m) {                          \
    case 1: panels3(1, x, p, y, K, N, nb, k0, k1, fetch); break;      \
    case 2: panels3(2, x, p, y, K, N, nb, k0, k1, fetch); break;      \
    case 3: panels3(3, x, p, y, K, N, nb, k0, k1, fetch); break;      \
    case 4: panels3(4, x, p, y, K, N, nb, k0, k1, fetch); break; }

/* x [M, K] and y [M, N] row-major, p the packed weights [N / 8, K, 8]. Per group of three
   panels and block of k, the rows in passes of at most 4, as even as they divide (9 rows:
   3 + 3 + 3, whose multiply-adds hide their latency as well as 4 + 4 + 1's and waste no pass
   on one row's loads): the first pass streams the weights from memory, the second prefetches
   the next block's while it reads this one again from L1, the rest read L1 alone; so the
   weights stream once whatever M (passes of 8 rows streamed them once a pass: 12 rows cost
   1.7x 8). The panels left over one at a time, 8 rows at a time. */
void smallm(const float *x, const float *p, float *y, int M, int K, int N, int threads) {
  const int groups = N / 24, passes = (M + 3) / 4;
  _Pragma("omp parallel for schedule(static) num_threads(threads)")
  for (int g = 0; g < groups; g++) {
    const int nb = g * 24;
    for (int k0 = 0; k0 < K; k0 += BLOCK) {
      const int k1 = k0 + BLOCK < K ? k0 + BLOCK : K;
      for (int j = 0, m0 = 0; j < passes; j++) {
        const int m = (M - m0) / (passes - j);
        UP_TO_4(m, x + (size_t)m0 * K, y + (size_t)m0 * N, j == 0 ? 1 : j == 1 ? 2 : 0)
        m0 += m;
      }
    }
  }
  for (int nb = groups * 24; nb < N; nb += 8)
    for (int m0 = 0; m0 < M; m0 += 8) {
      const float *xm = x + (size_t)m0 * K;
      float *ym = y + (size_t)m0 * N;
      switch (M - m0 < 8 ? M - m0 : 8) {
        case 1: panel(1, xm, p, ym, K, N, nb); break;
        case 2: panel(2, xm, p, ym, K, N, nb); break;
        case 3: panel(3, xm, p, ym, K, N, nb); break;
        case 4: panel(4, xm, p, ym, K, N, nb); break;
        case 5: panel(5, xm, p, ym, K, N, nb); break;
        case 6: panel(6, xm, p, ym, K, N, nb); break;
        case 7: panel(7, xm, p, ym, K, N, nb); break;
        case 8: panel(8, xm, p, ym, K, N, nb); break;
      }
    }
}

/* Llama's RMSNorm of M rows of D (the sum of squares in double: no worse than torch's). */
static void rmsnorm(const float *x, const float *w, float *h, int M, int D, float eps) {
  for (int i = 0; i < M; i++) {
    const float *xi = x + (size_t)i * D;
    float *hi = h + (size_t)i * D;
    double s = 0.0;
    for (int k = 0; k < D; k++) s += (double)xi[k] * xi[k];
    const float r = 1.0f / sqrtf((float)(s / D) + eps);
    for (int k = 0; k < D; k++) hi[k] = w[k] * (xi[k] * r);
  }
}

/* The layer before attention, M rows: h = RMSNorm(x); qkv = h W_qkv^T [M, all * hd]; RoPE on
   the first `rot` heads (queries and keys) by each row's cos and sin [M, hd] (sin signed, so
   rotating is x * cos + roll(x, hd / 2) * sin). h is scratch [M, D]. */
void layer_pre(const float *x, const float *norm, float eps, const float *p_qkv,
               const float *cos, const float *sin, float *h, float *qkv, int M, int D, int rot,
               int all, int hd, int threads) {
  rmsnorm(x, norm, h, M, D, eps);
  smallm(h, p_qkv, qkv, M, D, all * hd, threads);
  float t[hd];
  const int half = hd / 2;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < rot; j++) {
      float *q = qkv + ((size_t)i * all + j) * hd;
      const float *c = cos + (size_t)i * hd, *s = sin + (size_t)i * hd;
      for (int k = 0; k < hd; k++) t[k] = q[k];
      for (int k = 0; k < half; k++) q[k] = t[k] * c[k] + t[k + half] * s[k];
      for (int k = half; k < hd; k++) q[k] = t[k] * c[k] + t[k - half] * s[k];
    }
}

/* The layer after attention, M rows, in place on the residual x [M, D]: x += o W_out^T;
   h = RMSNorm(x); gu = h W_gate_up^T [M, 2I]; a = SiLU(gate) * up; x += a W_down^T.
   h [M, D], gu [M, 2I] and a [M, I] are scratch. */
void layer_post(float *x, const float *o, const float *p_out, const float *norm, float eps,
                const float *p_gu, const float *p_down, float *h, float *gu, float *a, int M,
                int D, int A, int I, int threads) {
  smallm(o, p_out, h, M, A, D, threads);
  for (size_t k = 0; k < (size_t)M * D; k++) x[k] += h[k];
  rmsnorm(x, norm, h, M, D, eps);
  smallm(h, p_gu, gu, M, D, 2 * I, threads);
  for (int i = 0; i < M; i++)
    for (int k = 0; k < I; k++) {
      const float g = gu[(size_t)i * 2 * I + k], u = gu[(size_t)i * 2 * I + I + k];
      a[(size_t)i * I + k] = g / (1.0f + expf(-g)) * u;
    }
  smallm(a, p_down, h, M, I, D, threads);
  for (size_t k = 0; k < (size_t)M * D; k++) x[k] += h[k];
}
"""
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]
LIBS = ["-lm"]
"""Linked after the source (``expf``, ``sqrtf``)."""
TAG = hashlib.sha1((SOURCE + " ".join(FLAGS + LIBS)).encode()).hexdigest()[:12]
"""The build's name: one per source and flags (and a step profile's key names it: another
kernel, other step costs)."""
ENV = "BATCHSPEC_SMALLM"
"""``BATCHSPEC_SMALLM=0``: oneDNN for every row count (to compare; or where the kernel is
suspected)."""


def unsupported() -> str | None:
    """Why the kernel cannot run on this machine, or None."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"not x86 ({platform.machine()})"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "no AVX2"
    return None


@cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel: from the cache, else built there first (one build per source and
    flags; concurrent workers each write files of their own and rename the build into place); None
    where it cannot run or be built, said once in the log."""
    why = unsupported()
    path = user_cache() / "kernels" / f"smallm-{TAG}.so"
    if why is None and not path.exists():
        why = build(path)
    if why is not None:
        log.info("small-row products by oneDNN: %s", why)
        return None
    lib = ctypes.CDLL(str(path))
    lib.smallm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    lib.smallm.restype = None
    floats, ints = [ctypes.c_void_p], [ctypes.c_int]
    pre = floats * 2 + [ctypes.c_float] + floats * 5 + ints * 6
    lib.layer_pre.argtypes, lib.layer_pre.restype = pre, None
    post = floats * 4 + [ctypes.c_float] + floats * 5 + ints * 5
    lib.layer_post.argtypes, lib.layer_post.restype = post, None
    return lib


def build(path: Path) -> str | None:
    """Compile the kernel to ``path`` with ``$CC`` (else ``cc``); why it failed, or None."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return f"no C compiler ({cc}; set $CC)"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Names of this host, process and a random token: workers of several hosts may build
    # into one shared cache at once, and their pids can be equal.
    tmp = temp_name(path)
    src = tmp.with_name(tmp.name + ".c")
    src.write_text(SOURCE)
    try:
        done = subprocess.run(
            [cc, *FLAGS, str(src), "-o", str(tmp), *LIBS], capture_output=True, text=True
        )
        if done.returncode != 0:
            return f"{cc} failed: {done.stderr.strip()[-300:]}"
        os.replace(tmp, path)
        return None
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


def small_kernel() -> ctypes.CDLL | None:
    """The kernel for this process's models, unless ``BATCHSPEC_SMALLM=0``."""
    return None if os.environ.get(ENV, "1") == "0" else load()


class Panels:
    """One weight matrix W [out, in] (float32, out a multiple of ``PANEL``) packed for the
    kernel; ``self(x)`` is ``x @ W.T`` for x [..., in] of any number of rows."""

    def __init__(self, weight: torch.Tensor, lib: ctypes.CDLL):
        out, inner = weight.shape
        self.out, self.inner, self.lib = out, inner, lib
        self.packed = weight.reshape(out // PANEL, PANEL, inner).transpose(1, 2).contiguous()

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        """Whether the kernel takes this matrix: float32 on the CPU, whole panels."""
        return (
            weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.shape[0] % PANEL == 0
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.inner).contiguous()
        if flat.dtype != torch.float32 or flat.device.type != "cpu":  # the kernel reads bytes
            raise TypeError(
                f"small-row kernel: float32 on the CPU, not {flat.dtype} on {flat.device}"
            )
        rows = flat.shape[0]
        y = torch.empty(rows, self.out, dtype=flat.dtype, device=flat.device)  # not the default
        threads = torch.get_num_threads()
        self.lib.smallm(
            flat.data_ptr(),
            self.packed.data_ptr(),
            y.data_ptr(),
            rows,
            self.inner,
            self.out,
            threads,
        )
        return y.view(*x.shape[:-1], self.out)
