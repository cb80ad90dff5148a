// paradec: a row-exact linear for x86 CPUs with AVX2 and FMA (see paradec/native.py).
//
// y[t][n] = sum_k x[t][k] * W[n][k] (+ b[n]) for a pass of M rows. Every output is one float accumulator that
// takes the products k = 0, 1, ..., K-1 in that order through fused multiply-adds, then adds the bias: the same
// arithmetic whichever tile, thread or row count computes it, so a row gets the same numbers in a pass of any
// size (row-exact by construction). The weight is packed in blocks of 16 outputs, k-major
// (wp[(blk * K + k) * 16 + j] = W[blk * 16 + j][k]), as bfloat16 or float32: a pass reads each block from memory
// once and multiplies it with up to 6 rows at a time from cache, so a pass over a few rows costs about what a
// pass over one costs.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <vector>

namespace {

#ifndef WIDEN_ROWS
#define WIDEN_ROWS 12
#endif

inline __m256 load8(const uint16_t* p) {   // 8 bfloat16 -> 8 float (exact: bf16 is float's top half)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// rows [0, MT) of x (leading dimension ldx) times one 16-output block; y gets the 16 outputs of each row
// (leading dimension ldy, `valid` of the 16 written). The accumulators are named variables, not an array: gcc
// keeps an array's elements in registers but also stores them to the stack at every k.
#define PD_ROW(t)                                                          \
    if (MT > t) {                                                          \
        const __m256 xb = _mm256_broadcast_ss(x + t * ldx + k);            \
        a##t##0 = _mm256_fmadd_ps(w0, xb, a##t##0);                        \
        a##t##1 = _mm256_fmadd_ps(w1, xb, a##t##1);                        \
    }
#define PD_OUT(t)                                                          \
    if (MT > t) put(a##t##0, a##t##1, bias, y + t * ldy, valid);

inline void put(__m256 lo, __m256 hi, const float* bias, float* out, int valid) {
    if (bias) {
        lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
        hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
    }
    if (valid == 16) {
        _mm256_storeu_ps(out, lo);
        _mm256_storeu_ps(out + 8, hi);
    } else {
        float tmp[16];
        _mm256_storeu_ps(tmp, lo);
        _mm256_storeu_ps(tmp + 8, hi);
        memcpy(out, tmp, sizeof(float) * valid);
    }
}

template <int MT, typename WT>
inline void tile(const float* x, int64_t ldx, int64_t K, const WT* wb, const float* bias, float* y, int64_t ldy,
                 int valid) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
           a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
    for (int64_t k = 0; k < K; ++k) {
        const __m256 w0 = load8(wb + k * 16), w1 = load8(wb + k * 16 + 8);
        PD_ROW(0) PD_ROW(1) PD_ROW(2) PD_ROW(3) PD_ROW(4) PD_ROW(5)
    }
    PD_OUT(0) PD_OUT(1) PD_OUT(2) PD_OUT(3) PD_OUT(4) PD_OUT(5)
}

// M = 1: two blocks at once, so four accumulator chains are in flight instead of two (each output's arithmetic
// is still tile<1>'s: one chain over k in order)
template <typename WT>
inline void tile1x2(const float* x, int64_t K, const WT* wb, const WT* wb2, const float* bias, float* y) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 xb = _mm256_broadcast_ss(x + k);
        a0 = _mm256_fmadd_ps(load8(wb + k * 16), xb, a0);
        a1 = _mm256_fmadd_ps(load8(wb + k * 16 + 8), xb, a1);
        a2 = _mm256_fmadd_ps(load8(wb2 + k * 16), xb, a2);
        a3 = _mm256_fmadd_ps(load8(wb2 + k * 16 + 8), xb, a3);
    }
    if (bias) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(bias));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(bias + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(bias + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(bias + 24));
    }
    _mm256_storeu_ps(y, a0);
    _mm256_storeu_ps(y + 8, a1);
    _mm256_storeu_ps(y + 16, a2);
    _mm256_storeu_ps(y + 24, a3);
}

template <typename WT>
inline void tiles(const float* x, int64_t M, int64_t K, const WT* wb, const float* b, float* yb, int64_t N,
                  int valid) {
    // ceil(M / 6) tiles of nearly equal rows (8 rows: 4 + 4, not 6 + 2: a tile of few rows keeps few FMAs in flight)
    const int64_t n = (M + 5) / 6, base = M / n, extra = M % n;
    int64_t t = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t rows = base + (i < extra ? 1 : 0);
        const float* xt = x + t * K;
        float* yt = yb + t * N;
        switch (rows) {
            case 6: tile<6>(xt, K, K, wb, b, yt, N, valid); break;
            case 5: tile<5>(xt, K, K, wb, b, yt, N, valid); break;
            case 4: tile<4>(xt, K, K, wb, b, yt, N, valid); break;
            case 3: tile<3>(xt, K, K, wb, b, yt, N, valid); break;
            case 2: tile<2>(xt, K, K, wb, b, yt, N, valid); break;
            default: tile<1>(xt, K, K, wb, b, yt, N, valid); break;
        }
        t += rows;
    }
}

template <typename WT>
void block(const float* x, int64_t M, int64_t K, const WT* wp, int64_t N, const float* bias, float* y,
           int64_t blk) {
    const WT* wb = wp + blk * K * 16;
    const float* b = bias ? bias + blk * 16 : nullptr;
    float* yb = y + blk * 16;
    const int valid = (int)((N - blk * 16) < 16 ? (N - blk * 16) : 16);
    if (sizeof(WT) == 2 && M > WIDEN_ROWS) {
        // many tiles read this block: widen it to float32 once (exact), so the tiles skip the conversion
        thread_local std::vector<float> wide;
        wide.resize((size_t)K * 16);
        for (int64_t i = 0; i < K * 16; i += 8) _mm256_storeu_ps(wide.data() + i, load8(wb + i));
        tiles(x, M, K, (const float*)wide.data(), b, yb, N, valid);
        return;
    }
    tiles(x, M, K, wb, b, yb, N, valid);
}

template <typename WT>
void run(const float* x, int64_t M, int64_t K, const WT* wp, int64_t N, const float* bias, float* y, int threads) {
    const int64_t blocks = (N + 15) / 16;
    if (M == 1) {
        const int64_t pairs = blocks / 2;     // full pairs of full blocks, then what is left one block at a time
        const int64_t full = (N % 16 == 0) ? pairs : (blocks - 1) / 2;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t p = 0; p < full; ++p)
            tile1x2(x, K, wp + 2 * p * K * 16, wp + (2 * p + 1) * K * 16, bias ? bias + 32 * p : nullptr, y + 32 * p);
        for (int64_t blk = 2 * full; blk < blocks; ++blk) block(x, M, K, wp, N, bias, y, blk);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t blk = 0; blk < blocks; ++blk) block(x, M, K, wp, N, bias, y, blk);
}

// ---- gated LoRA deltas on a few rows (paradec/adapters.py): y[i][o] += sum_j t[i][j] * bt[j][o] with
// t[i][j] = sum_k x[i][k] * a[j][k], all bfloat16 in memory, float32 inside, one thread (a few rows and a rank-r
// pair are microseconds of work: a parallel region would cost more than it saves).

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
inline uint16_t to_bf16(float f) {          // round to nearest even, as torch rounds
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline void store8_bf16(uint16_t* p, __m256 f) {
    __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
    _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
}

#ifndef PREFETCH
#define PREFETCH 1024
#endif

template <int M>
void lora_rows(const uint16_t* x, int64_t sx, int64_t in, const uint16_t* a, int64_t r, int64_t nseg,
               const int64_t* seg, const uint16_t* bt, uint16_t* y, int64_t sy) {
    // x's rows once in float32 (they are read r times); products in independent accumulators (two per row and
    // step) so that the fused multiply-adds are not waiting on each other. The work is a few microseconds of
    // arithmetic on weights read from memory (17.6 MB a pass for the default model's LUD parameters), on the
    // calling thread: a parallel region beside torch's busy threads (a race of strategies) can wait far longer
    // than the work takes. The weights are prefetched a few cache lines ahead.
    const int64_t in16 = in - in % 16;
    std::vector<float> xf(M * in), t(M * r);
    for (int i = 0; i < M; ++i) {
        int64_t k = 0;
        for (; k + 8 <= in; k += 8) _mm256_storeu_ps(&xf[i * in + k], load8(x + i * sx + k));
        for (; k < in; ++k) xf[i * in + k] = from_bf16(x[i * sx + k]);
    }
    std::vector<int64_t> first(nseg + 1, 0);                  // each member's first block, over all members
    std::vector<const uint16_t*> bstart(nseg);
    const uint16_t* b = bt;
    for (int64_t g = 0; g < nseg; ++g) {
        bstart[g] = b;
        const int64_t blocks = (seg[4 * g + 3] + 15) / 16;
        first[g + 1] = first[g] + blocks;
        b += blocks * seg[4 * g + 1] * 16;
    }
    const int64_t total = first[nseg];
    for (int64_t j = 0; j < r; ++j) {                    // first product: M x r dot products over `in`
        const uint16_t* aj = a + j * in;
        __m256 acc0[M], acc1[M];
        for (int i = 0; i < M; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
        for (int64_t k = 0; k < in16; k += 16) {
            _mm_prefetch((const char*)(aj + k) + PREFETCH, _MM_HINT_T0);
            const __m256 a0 = load8(aj + k), a1 = load8(aj + k + 8);
            for (int i = 0; i < M; ++i) {
                acc0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(&xf[i * in + k]), a0, acc0[i]);
                acc1[i] = _mm256_fmadd_ps(_mm256_loadu_ps(&xf[i * in + k + 8]), a1, acc1[i]);
            }
        }
        for (int i = 0; i < M; ++i) {
            float s = hsum(_mm256_add_ps(acc0[i], acc1[i]));
            for (int64_t k = in16; k < in; ++k) s += xf[i * in + k] * from_bf16(aj[k]);
            t[i * r + j] = s;
        }
    }
    for (int64_t blk = 0; blk < total; ++blk) {           // second product: one block of 16 outputs
        int64_t g = 0;
        while (first[g + 1] <= blk) ++g;
        const int64_t r0 = seg[4 * g], rs = seg[4 * g + 1], o0 = seg[4 * g + 2], os = seg[4 * g + 3];
        const int64_t o = (blk - first[g]) * 16;
        const uint16_t* bb = bstart[g] + (blk - first[g]) * rs * 16;   // this block's rs x 16 values
        __m256 acc0[M], acc1[M];
        for (int i = 0; i < M; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
        for (int64_t j = 0; j < rs; ++j) {
            _mm_prefetch((const char*)(bb + j * 16) + PREFETCH, _MM_HINT_T0);
            const __m256 b0 = load8(bb + j * 16), b1 = load8(bb + j * 16 + 8);
            for (int i = 0; i < M; ++i) {
                const __m256 tv = _mm256_broadcast_ss(&t[i * r + r0 + j]);
                acc0[i] = _mm256_fmadd_ps(tv, b0, acc0[i]);
                acc1[i] = _mm256_fmadd_ps(tv, b1, acc1[i]);
            }
        }
        const int64_t valid = os - o < 16 ? os - o : 16;
        for (int i = 0; i < M; ++i) {
            uint16_t* yo = y + i * sy + o0 + o;
            if (valid == 16) {
                store8_bf16(yo, _mm256_add_ps(load8(yo), acc0[i]));
                store8_bf16(yo + 8, _mm256_add_ps(load8(yo + 8), acc1[i]));
            } else {
                float d[16];
                _mm256_storeu_ps(d, acc0[i]);
                _mm256_storeu_ps(d + 8, acc1[i]);
                for (int64_t c = 0; c < valid; ++c) yo[c] = to_bf16(from_bf16(yo[c]) + d[c]);
            }
        }
    }
}

}  // namespace

extern "C" {

// x (M, K) float32 row-major; wp packed (ceil(N / 16) blocks); bias (N) or null; y (M, N) float32
void pd_linear_bf16(const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N, const float* bias,
                    float* y, int threads) {
    run(x, M, K, wp, N, bias, y, threads);
}
void pd_linear_f32(const float* x, int64_t M, int64_t K, const float* wp, int64_t N, const float* bias, float* y,
                   int threads) {
    run(x, M, K, wp, N, bias, y, threads);
}

// x: M rows of `in` bfloat16 (row stride sx); a: (r, in) bfloat16, the members' A stacked; bt: each member's
// scale * B^T in blocks of 16 outputs, each block r_s x 16 contiguous (the last one padded with zeros), bfloat16,
// the members one after another; seg: 4 per member (its first row of a, r_s, its first output column, out_s);
// y: M rows of bfloat16 outputs (row stride sy), added to in place. M >= 1.
int pd_lora_bf16(const uint16_t* x, int64_t sx, int64_t M, int64_t in, const uint16_t* a, int64_t r, int64_t nseg,
                 const int64_t* seg, const uint16_t* bt, uint16_t* y, int64_t sy) {
    if (M < 1) return 1;
    for (int64_t i0 = 0; i0 < M; i0 += 8) {      // 8 rows at a time (the weights stay in cache for the next 8)
        const uint16_t* xi = x + i0 * sx;
        uint16_t* yi = y + i0 * sy;
        switch (M - i0 < 8 ? M - i0 : 8) {
            case 1: lora_rows<1>(xi, sx, in, a, r, nseg, seg, bt, yi, sy); break;
            case 2: lora_rows<2>(xi, sx, in, a, r, nseg, seg, bt, yi, sy); break;
            case 3: lora_rows<3>(xi, sx, in, a, r, nseg, seg, bt, yi, sy); break;
            case 4: lora_rows<4>(xi, sx, in, a, r, nseg, seg, bt, yi, sy); break;
            case 5: lora_rows<5>(xi, sx, in, a, r, nseg, seg, bt, yi, sy); break;
            case 6: lora_rows<6>(xi, sx, in, a, r, nseg, seg, bt, yi, sy); break;
            case 7: lora_rows<7>(xi, sx, in, a, r, nseg, seg, bt, yi, sy); break;
            default: lora_rows<8>(xi, sx, in, a, r, nseg, seg, bt, yi, sy); break;
        }
    }
    return 0;
}
}
