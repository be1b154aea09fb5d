/* Batched W4A16 and W8A16 on CPU: the GEMV kernels' arithmetic (w4_gemv.c, w8_gemv.c) over register
 * tiles of several tokens x output rows, each weight vector unpacked once per tile and used by
 * every token of it.
 *
 * Activations are rounded to int16 codes per group as for the GEMVs (act_int16.h: the same codes,
 * steps and code sums). Weights are unsigned codes u in row panels (panel_simd.h) with a zero point
 * per (row, group): W4A16 its 4-bit codes and zero points, W8A16 its INT8 codes + 128 with zero 128
 * and one "group" per block of 256 channels (the GEMV's activation blocks). Bytes are widened to
 * int16 (unpack with zero) and multiplied with int16 activation pairs (vpdpwssd, or vpmaddwd +
 * vpaddd): per (token, row, group) P = sum(u * x) - z * sum(x) is the exact int32 the GEMVs compute
 * (intermediate sums wrap modulo 2^32; P fits), then f = fma(float(P), w_scale * x_step, f) in group
 * order from 0, as they do. So the same bits as the GEMVs, in every build (tested); a token's result
 * does not depend on its batch.
 *
 * Why int16 and not bf16 dot products (vdpbf16ps): on the CPUs measured both take 32 products per
 * 512-bit instruction, and int16 keeps the GEMV's error bound (2^-16 of a group's absmax per value,
 * against bf16's 2^-9 relative) and its bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "panel_simd.h"
#define ACT_SIMD (PANEL_SIMD != 0)
#include "act_int16.h"

int a16_gemm_simd(void) { return panel_simd_level(); }

#if PANEL_SIMD == 512 && !defined(MR)
#define MR 4 /* tokens x NV vectors of 16 rows x 2 half-accumulators: 16 registers, 8 weight vectors */
#define NV 2
#elif PANEL_SIMD == 512
#elif PANEL_SIMD == 256
#define MR 3 /* 16 ymm registers: 6 accumulators, 4 weight vectors, 2 broadcasts */
#define NV 1
#endif
/* Vectors of rows a tile may span: NV, or for few tokens on AVX2 a whole panel (a16_few_item) */
#define NV_MAX (PANEL > NV * VL ? PANEL / VL : NV)

struct a16_args {
    const uint8_t *w;
    const float *sw;   /* [out / 16, ng, 16] */
    const int32_t *zw; /* [out / 16, ng, 16] */
    int64_t out, kp, group, ng, t;
    int nibbles;
    const int16_t *x;  /* [t, kp] */
    const float *sx;   /* [t, ng] */
    const int32_t *xs; /* [t, ng] */
    float *y;          /* [t, out] */
};

#if PANEL_SIMD
/* Exact products of mr tokens x nv vectors over channels [a, b). Accumulator h = 0 holds, per 128-bit
 * lane of 4 rows, rows 0 and 1 (two partial sums each), h = 1 rows 2 and 3: what the byte unpacks give. */
static inline __attribute__((always_inline)) void dot_tile(vi_t acc[MR][NV_MAX][2], const struct a16_args *A,
                                                           const int16_t *x, int64_t r0, int64_t a, int64_t b,
                                                           const int mr, const int nv) {
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) acc[m][v][0] = acc[m][v][1] = VZERO();
    const int64_t kp = A->kp;
    if (A->nibbles && nv > NV) { /* AVX2 whole-panel tiles: each half's 4 weight vectors used by every
                                  * token before the next half's are unpacked (16 ymm registers) */
        for (int64_t k = a; k < b; k += 8)
            for (int v = 0; v < nv; v++) {
                vi_t raw = panel_load(A->w, r0 + v * VL, k, kp, 1), lo = VMASK4(raw), hi = VSHR4(raw);
                vi_t w0 = VUNPLO8(lo), w1 = VUNPHI8(lo), w2 = VUNPLO8(hi), w3 = VUNPHI8(hi);
                for (int m = 0; m < mr; m++) {
                    vi_t xa = VBCAST64(x + m * kp + k), xb = VBCAST64(x + m * kp + k + 4);
                    acc[m][v][0] = DOT16(DOT16(acc[m][v][0], w0, xa), w2, xb);
                    acc[m][v][1] = DOT16(DOT16(acc[m][v][1], w1, xa), w3, xb);
                }
            }
    } else if (A->nibbles) {
        for (int64_t k = a; k < b; k += 8) {
            vi_t w0[NV_MAX], w1[NV_MAX], w2[NV_MAX], w3[NV_MAX];
            for (int v = 0; v < nv; v++) {
                vi_t raw = panel_load(A->w, r0 + v * VL, k, kp, 1), lo = VMASK4(raw), hi = VSHR4(raw);
                w0[v] = VUNPLO8(lo), w1[v] = VUNPHI8(lo), w2[v] = VUNPLO8(hi), w3[v] = VUNPHI8(hi);
            }
            for (int m = 0; m < mr; m++) {
                vi_t xa = VBCAST64(x + m * kp + k), xb = VBCAST64(x + m * kp + k + 4);
                for (int v = 0; v < nv; v++) {
                    acc[m][v][0] = DOT16(DOT16(acc[m][v][0], w0[v], xa), w2[v], xb);
                    acc[m][v][1] = DOT16(DOT16(acc[m][v][1], w1[v], xa), w3[v], xb);
                }
            }
        }
    } else {
        for (int64_t k = a; k < b; k += 4) {
            vi_t w0[NV_MAX], w1[NV_MAX];
            for (int v = 0; v < nv; v++) {
                vi_t raw = panel_load(A->w, r0 + v * VL, k, kp, 0);
                w0[v] = VUNPLO8(raw), w1[v] = VUNPHI8(raw);
            }
            for (int m = 0; m < mr; m++) {
                vi_t xa = VBCAST64(x + m * kp + k);
                for (int v = 0; v < nv; v++)
                    acc[m][v][0] = DOT16(acc[m][v][0], w0[v], xa), acc[m][v][1] = DOT16(acc[m][v][1], w1[v], xa);
            }
        }
    }
}

/* f += float(P) * (w_scale * x_step) for group g, P the exact product of each (token, row). */
static inline __attribute__((always_inline)) void rescale(vf_t f[MR][NV_MAX], vi_t acc[MR][NV_MAX][2], const struct a16_args *A,
                                                          int64_t i0, int64_t r0, int64_t g, const int mr,
                                                          const int nv) {
    for (int v = 0; v < nv; v++) {
        int64_t r = r0 + v * VL, q = ((r / PANEL) * A->ng + g) * PANEL + r % PANEL;
        vf_t swv = FLOAD(A->sw + q);
        vi_t zv = VLOAD32(A->zw + q);
        for (int m = 0; m < mr; m++) {
            int64_t s = (i0 + m) * A->ng + g;
            /* rows in order: lane pairs (0, 1) of each half-accumulator summed */
            vi_t p = VADD32(VSHUF(acc[m][v][0], acc[m][v][1], 0x88), VSHUF(acc[m][v][0], acc[m][v][1], 0xDD));
            p = VSUB32(p, VMUL32(zv, VSET32(A->xs[s])));
            f[m][v] = FMA(FCVT(p), FMUL(swv, FSET(A->sx[s])), f[m][v]);
        }
    }
}

static inline __attribute__((always_inline)) void tile(const struct a16_args *A, int64_t i0, int64_t r0, const int mr,
                                                       const int nv) {
    vi_t acc[MR][NV_MAX][2];
    vf_t f[MR][NV_MAX];
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) f[m][v] = FZERO();
    for (int64_t g = 0; g < A->ng; g++) {
        int64_t a = g * A->group, b = a + A->group < A->kp ? a + A->group : A->kp;
        dot_tile(acc, A, A->x + i0 * A->kp, r0, a, b, mr, nv);
        rescale(f, acc, A, i0, r0, g, mr, nv);
    }
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) FSTORE(A->y + (i0 + m) * A->out + r0 + v * VL, f[m][v]);
}

/* Many tokens: the row tile's weights are widened to int16 once (into buf: the vectors dot_tile
 * unpacks, in its order, for all kp channels) and read back by every token tile, instead of being
 * unpacked again for each. buf is per thread, kept between calls (NV * kp / 2 vectors). */
static __thread uint8_t *wide_buf;
static __thread int64_t wide_cap;

static vi_t *widen(const struct a16_args *A, int64_t r0, int nv) {
    vi_t *const buf = (vi_t *)grow_buffer(&wide_buf, &wide_cap, NV * A->kp / 2 * (int64_t)sizeof(vi_t));
    if (!buf) return NULL;
    vi_t *o = buf;
    for (int64_t k = 0; k < A->kp; k += A->nibbles ? 8 : 4)
        for (int v = 0; v < nv; v++) {
            vi_t raw = panel_load(A->w, r0 + v * VL, k, A->kp, A->nibbles);
            if (A->nibbles) {
                vi_t lo = VMASK4(raw), hi = VSHR4(raw);
                *o++ = VUNPLO8(lo), *o++ = VUNPHI8(lo), *o++ = VUNPLO8(hi), *o++ = VUNPHI8(hi);
            } else {
                *o++ = VUNPLO8(raw), *o++ = VUNPHI8(raw);
            }
        }
    return buf;
}

static inline __attribute__((always_inline)) void wide_tile(const struct a16_args *A, const vi_t *buf, int64_t i0,
                                                            int64_t r0, const int mr, const int nv) {
    vi_t acc[MR][NV_MAX][2];
    vf_t f[MR][NV_MAX];
    const int64_t kp = A->kp;
    const int16_t *x = A->x + i0 * kp;
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) f[m][v] = FZERO();
    for (int64_t g = 0; g < A->ng; g++) {
        const int64_t a = g * A->group, b = a + A->group < kp ? a + A->group : kp;
        for (int m = 0; m < mr; m++)
            for (int v = 0; v < nv; v++) acc[m][v][0] = acc[m][v][1] = VZERO();
        if (A->nibbles) {
            for (int64_t k = a; k < b; k += 8, buf += 4 * nv)
                for (int m = 0; m < mr; m++) {
                    vi_t xa = VBCAST64(x + m * kp + k), xb = VBCAST64(x + m * kp + k + 4);
                    for (int v = 0; v < nv; v++) {
                        acc[m][v][0] = DOT16(DOT16(acc[m][v][0], buf[4 * v], xa), buf[4 * v + 2], xb);
                        acc[m][v][1] = DOT16(DOT16(acc[m][v][1], buf[4 * v + 1], xa), buf[4 * v + 3], xb);
                    }
                }
        } else {
            for (int64_t k = a; k < b; k += 4, buf += 2 * nv)
                for (int m = 0; m < mr; m++) {
                    vi_t xa = VBCAST64(x + m * kp + k);
                    for (int v = 0; v < nv; v++)
                        acc[m][v][0] = DOT16(acc[m][v][0], buf[2 * v], xa),
                        acc[m][v][1] = DOT16(acc[m][v][1], buf[2 * v + 1], xa);
                }
        }
        rescale(f, acc, A, i0, r0, g, mr, nv);
    }
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) FSTORE(A->y + (i0 + m) * A->out + r0 + v * VL, f[m][v]);
}

#define A16_TILE(mr) (nv == NV ? tile(A, i, r0, (mr), NV) : tile(A, i, r0, (mr), 1))
#define A16_WIDE(mr) (nv == NV ? wide_tile(A, buf, i, r0, (mr), NV) : wide_tile(A, buf, i, r0, (mr), 1))
/* Every token of A in tiles of mr0 tokens, then 2, then 1: CALL(mr) with i the tile's first token
 * (mr a constant in each call, so that each tile's registers are allocated for its size). */
#define A16_TOKEN_TILES(mr0, CALL)                                    \
    for (int64_t i = 0; i < A->t;) {                                  \
        const int64_t left_ = A->t - i;                               \
        const int mr_ = left_ >= (mr0) ? (mr0) : left_ >= 2 ? 2 : 1; \
        if (mr_ == (mr0)) CALL(mr0);                                  \
        else if (mr_ == 2) CALL(2);                                   \
        else CALL(1);                                                 \
        i += mr_;                                                     \
    }

/* NV vectors of rows from r0 (fewer at the end), every token, the weights widened once. */
static void a16_rows(const struct a16_args *A, const int64_t r0) {
    const int nv = (A->out - r0) / VL < NV ? (int)((A->out - r0) / VL) : NV;
    const vi_t *buf = widen(A, r0, nv);
    if (buf) {
        A16_TOKEN_TILES(MR, A16_WIDE)
    } else { /* no memory: unpack in place */
        A16_TOKEN_TILES(MR, A16_TILE)
    }
}

/* Few tokens (decode, small batches): every tile unpacks its weights in place, in work items of
 * A16_FEW_ROWS rows. Measured with the weights read from memory (the caches flushed before each
 * call), 2 threads, 4096^2 and the default model's shapes, AMD Zen 4 and its AVX2 build
 * (scripts/a16_small_batch_ab.py; docs/measurements/a16_few_tokens_*epyc_zen4_2026-12-05.json):
 * - the widened copy (widen) cost more than it saved below 9 tokens on AVX2 and up to 64 on
 *   AVX-512, whose vpdpwssd leaves the unpacking the larger share (W4A16 4096^2, 8 tokens:
 *   1.26 -> 0.85 ms);
 * - items of 128 rows beat a panel or two each: every item starts a new stream of codes that the
 *   prefetches reach only 2 KB into;
 * - on AVX2 a tile spans a whole panel (both halves of every 64-byte line) for up to 2 tokens,
 *   each half's weight vectors unpacked once and used by both tokens (dot_tile's nv > NV order):
 *   the lines are used whole as they stream in, as the one-token tile alone did before. */
#if NV_MAX > NV
#define A16_FEW_T 8
#define A16_FEW_MR 2
#else
#define A16_FEW_T 64
#define A16_FEW_MR MR
#endif
#define A16_FEW_ROWS 128
#define A16_FEW_TILE(mr) (nv == NV_MAX ? tile(A, i, r0, (mr), NV_MAX) : tile(A, i, r0, (mr), 1))
static void a16_few_item(const void *ctx, int64_t item) {
    const struct a16_args *A = ctx;
    const int64_t end = (item + 1) * A16_FEW_ROWS < A->out ? (item + 1) * A16_FEW_ROWS : A->out;
    for (int64_t r0 = item * A16_FEW_ROWS; r0 < end; r0 += NV_MAX * VL) {
        const int nv = (end - r0) / VL < NV_MAX ? 1 : NV_MAX; /* AVX-512: one 16-row vector at the end */
        A16_TOKEN_TILES(A16_FEW_MR, A16_FEW_TILE)
    }
}

/* Many tokens: a work item is a whole panel, every tile's weights widened once (a16_rows). AVX2's
 * row tile (8 rows) is half a panel, whose halves share every 64-byte line: as items of their own,
 * taken by different threads, each thread would pull every line of the panel and use half of it. */
#define A16_TILES_PER_ITEM (PANEL > NV * VL ? PANEL / (NV * VL) : 1)
static void a16_item(const void *ctx, int64_t item) {
    const struct a16_args *A = ctx;
    for (int64_t s = 0; s < A16_TILES_PER_ITEM; s++) {
        const int64_t r0 = (item * A16_TILES_PER_ITEM + s) * NV * VL;
        if (r0 < A->out) a16_rows(A, r0);
    }
}
#define A16_ROWS_PER_ITEM (A16_TILES_PER_ITEM * NV * VL)
#else
/* Portable: the same integers and float steps, one row and token at a time. */
static void a16_item(const void *ctx, int64_t item) {
    const struct a16_args *A = ctx;
    for (int64_t r = item * PANEL; r < (item + 1) * PANEL; r++)
        for (int64_t i = 0; i < A->t; i++) {
            float f = 0.f;
            for (int64_t g = 0; g < A->ng; g++) {
                int64_t a = g * A->group, b = a + A->group < A->kp ? a + A->group : A->kp, s = i * A->ng + g;
                int64_t q = ((r / PANEL) * A->ng + g) * PANEL + r % PANEL;
                uint32_t acc = panel_dot(A->w, A->nibbles, A->kp, r, a, b, A->x + i * A->kp, 2);
                int32_t p = (int32_t)(acc - (uint32_t)A->zw[q] * (uint32_t)A->xs[s]);
                f = fmaf((float)p, A->sw[q] * A->sx[s], f);
            }
            A->y[i * A->out + r] = f;
        }
}
#define A16_ROWS_PER_ITEM PANEL
#endif

#include "a16_amx.h"
#include "a16_dequant.h"

/* The weight as bfloat16 rows dst [out, n] (a16_dequant.h). */
void a16_gemm_dequant(const uint8_t *w, int nibbles, const float *sw, const int32_t *zw, int64_t out_pad, int64_t kp,
                      int64_t group, int64_t ng, int64_t n, int64_t out, uint16_t *dst, int threads) {
    struct dequant_job J = {w, sw, zw, out, n, kp, group, ng, nibbles, dst};
    pool_run(dequant_item, &J, out_pad / PANEL, threads);
}

/* 1 where this build runs AMX-INT8 tiles (from A16_AMX_MIN_T tokens on) and the OS granted tile state. */
int a16_gemm_amx(void) {
#if A16_AMX
    return amx_ready();
#else
    return 0;
#endif
}

struct a16_weight {
    const uint8_t *w;
    const float *sw;
    const int32_t *zw;
    int64_t out, kp, group, ng;
    int nibbles;
};

#include "a16_amx_bf16.h"

/* 1 where this build has AMX-BF16 tiles and the OS granted tile state (a16_gemm.py sends bfloat16
 * calls of many tokens to a16_gemm_bf16_linear then). */
int a16_gemm_amx_bf16(void) {
#if A16_AMX_BF16
    return amx_ready();
#else
    return 0;
#endif
}

#include "a16_dpbf16.h"

/* 1 where this build has the AVX512_BF16 dot products (a16_dpbf16.h): AMX builds too, where
 * a16_gemm_bf16_linear takes them only when the OS refused the tiles (a16_gemm.py asks both). */
int a16_gemm_dpbf16(void) { return A16_DPBF16; }

/* A W4A16 / W8A16 linear on bfloat16 products: the AMX-BF16 tiles (a16_amx_bf16.h) where the build
 * has them and the OS granted tile state (unless dot: the AVX512_BF16 dot products of a16_dpbf16.h
 * anyway, so that they are tested on AMX CPUs too), else the dot products: x [t, k] bfloat16 ->
 * y [t, out] bfloat16, out a multiple of 16; the arguments as a16_gemm_linear's. Returns 0; -1 out
 * of memory; 1 where it cannot run (neither in this build, or not bfloat16 in and out). */
static int bf16_linear(int dot, const uint8_t *w, int nibbles, const float *sw, const int32_t *zw, int64_t out,
                       int64_t kp, int64_t group, int64_t ng, int64_t k, const void *x, int x_bf16, int64_t t, void *y,
                       int y_bf16, int threads) {
#if A16_AMX_BF16 || A16_DPBF16
    if (!x_bf16 || !y_bf16) return 1;
    if (t <= 0) return 0;
    const struct a16_weight m = {w, sw, zw, out, kp, group, ng, nibbles};
#if A16_AMX_BF16
    if (!dot && amx_ready()) return a16_bf16_run(&m, k, x, t, y, threads);
#endif
#if A16_DPBF16
    return a16_dpbf16_run(&m, k, x, t, y, threads);
#endif
#endif
    (void)dot, (void)w, (void)nibbles, (void)sw, (void)zw, (void)out, (void)kp, (void)group, (void)ng, (void)k;
    (void)x, (void)x_bf16, (void)t, (void)y, (void)y_bf16, (void)threads;
    return 1;
}

int a16_gemm_bf16_linear(const uint8_t *w, int nibbles, const float *sw, const int32_t *zw, int64_t out, int64_t kp,
                         int64_t group, int64_t ng, int64_t k, const void *x, int x_bf16, int64_t t, void *y,
                         int y_bf16, int threads) {
    return bf16_linear(0, w, nibbles, sw, zw, out, kp, group, ng, k, x, x_bf16, t, y, y_bf16, threads);
}

/* The AVX512_BF16 dot products whatever the tiles (the tests' entry point); 1 where the build lacks them. */
int a16_gemm_dpbf16_linear(const uint8_t *w, int nibbles, const float *sw, const int32_t *zw, int64_t out,
                           int64_t kp, int64_t group, int64_t ng, int64_t k, const void *x, int x_bf16, int64_t t,
                           void *y, int y_bf16, int threads) {
    return bf16_linear(1, w, nibbles, sw, zw, out, kp, group, ng, k, x, x_bf16, t, y, y_bf16, threads);
}

static void a16_gemm_codes(const void *ctx, const int16_t *xq, const float *sx, const int32_t *xsum, int64_t t,
                           float *y, int threads) {
    const struct a16_weight *m = ctx;
    struct a16_args A = {m->w, m->sw, m->zw, m->out, m->kp, m->group, m->ng, t, m->nibbles, xq, sx, xsum, y};
#if A16_AMX
    if (t >= A16_AMX_MIN_T && !a16_amx_run(&A, threads)) return;
#endif
#if PANEL_SIMD
    if (t <= A16_FEW_T) {
        pool_run(a16_few_item, &A, (m->out + A16_FEW_ROWS - 1) / A16_FEW_ROWS, threads);
        return;
    }
#endif
    pool_run(a16_item, &A, (m->out + A16_ROWS_PER_ITEM - 1) / A16_ROWS_PER_ITEM, threads);
}

/* One W4A16 (nibbles = 1) or W8A16 (0) linear: x [t, k] float32 (x_bf16 = 0) or bfloat16 (1),
 * rounded to int16 codes per group of `group` channels (ng over kp) -> y [t, out] float32 or
 * bfloat16 (y_bf16); out a multiple of 16. Returns 0, or -1 if out of memory. */
int a16_gemm_linear(const uint8_t *w, int nibbles, const float *sw, const int32_t *zw, int64_t out, int64_t kp,
                    int64_t group, int64_t ng, int64_t k, const void *x, int x_bf16, int64_t t, void *y, int y_bf16,
                    int threads) {
    struct a16_weight m = {w, sw, zw, out, kp, group, ng, nibbles};
    return a16_linear(a16_gemm_codes, &m, out, k, kp, group, ng, 1, x, x_bf16, t, y, y_bf16, threads);
}
