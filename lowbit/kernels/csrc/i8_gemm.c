/* Batched integer matrix products for W8A8 and W4A4 on CPU (prefill, batched decode): int8 dot
 * products with register tiles over several tokens x output rows.
 *
 * Weights are unsigned codes u with one zero point z for the whole matrix (symmetric INT8: u = c +
 * 128, z = 128; symmetric INT4: u = c + 8, z = 8), laid out in "panels" of 16 rows: for every 4
 * input channels one 64-byte vector [16 rows][4 channels], so one vpdpbusd (AVX-512 VNNI) takes 4
 * channels of 16 rows against 4 activation bytes broadcast to every lane. 4-bit panels hold 8
 * channels per 64 bytes: byte (row r, j) has channel j in its low nibble and channel 4 + j in its
 * high one, so a mask and a shift give two such vectors. (lowbit/kernels/cpu/i8_gemm.py, ``pack``.)
 *
 * Activations are signed INT8 (or INT4) codes x. Per (token, row, group) the product is
 *     P = sum(u * x) - z * sum(x) = sum((u - z) * x)
 * exact in int32 (the unsigned x signed form needs no +128 offset on the activations: the weight is
 * the unsigned operand); intermediate sums wrap modulo 2^32, and P itself fits in int32 whenever the
 * true sum does, so the result is exact. Then, as the GEMV kernels (w4_gemv.c, w8_gemv.c) do:
 *     f = fma(float(P), w_scale * x_scale, f)      in group order, starting at 0,
 * and an optional INT8 outlier part (its own panels, one group): f = f + fma(float(P_o), s_o * sx_o, 0)
 * (what w4a4.py adds after the 8-bit GEMV). So the same bits as those kernels and the portable build.
 *
 * Builds: AVX-512 VNNI (zmm vpdpbusd); AVX-512 BW without VNNI and AVX2 use vpmaddubsw + vpmaddwd
 * for 4-bit u, exact because its int16 pair sums cannot saturate (2 * 15 * 128 < 2^15), and for
 * 8-bit panels int16 pairs (BYTES16 below: the codes zero-extended against the activations widened
 * to int16 once per call, vpmaddwd); AVX-VNNI (ymm vpdpbusd); the portable C loop. AMX-INT8 builds run tiles from 8 tokens (INT8 panels) or 48 (4-bit)
 * on (i8_amx.h): the same integers. Threads: the work pool (work_pool.h) over tiles of rows, and over
 * blocks of tokens for the activation passes.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "panel_simd.h"
#define I8_SIMD PANEL_SIMD
#define ACT_SIMD (I8_SIMD != 0)
#include "act_sym.h"

int i8_gemm_simd(void) { return panel_simd_level(); }

struct i8_args {
    const uint8_t *w;   /* panels */
    const float *sw;    /* [out / 16, ng, 16] */
    int64_t out, kp, group, ng, t;
    int32_t zero;
    int nibbles;
    const int8_t *x;    /* [t, kp] */
    const float *sx;    /* [t, ng] */
    const int32_t *zx;  /* [t, ng]: zero * sum of the group's codes */
    const int16_t *x16, *xo16; /* BYTES16: x and xo as int16 pairs (to_int8); else NULL */
    /* optional INT8 outliers (wo NULL: none): byte panels [out / 16, kpo / 4, 16, 4], zero 128 */
    const uint8_t *wo;
    const float *swo;   /* [out / 16, 16] */
    int64_t kpo;
    const int8_t *xo;   /* [t, kpo] */
    const float *sxo;   /* [t] */
    const int32_t *zxo; /* [t] */
    void *y;            /* [t, out] float32, or bfloat16 (y_bf16) rounded as torch's .to(bfloat16) */
    int y_bf16;
};

/* n finished float32 results at y[i, r..] in the output's dtype. */
static inline void out_row(const struct i8_args *A, int64_t i, int64_t r, const float *f, int64_t n) {
    if (A->y_bf16)
        f32_to_bf16_row((uint16_t *)A->y + i * A->out + r, f, n);
    else
        memcpy((float *)A->y + i * A->out + r, f, (size_t)n * sizeof(float));
}

#if I8_SIMD == 512
#define MR 6 /* tokens x NV vectors of 16 rows: 12 accumulators, 2 weight vectors, 1 broadcast */
#define NV 2
#elif I8_SIMD == 256
#define MR 4 /* 16 ymm registers: 8 accumulators */
#define NV 2
#endif

#if I8_SIMD
#ifdef DOT_VNNI
#define DOT_SMALL(acc, u, x) VDPBUSD(acc, u, x) /* u <= 15 */
#define DOT_BYTE(acc, u, x) VDPBUSD(acc, u, x)
#if I8_SIMD == 512
/* acc + the dot products of u with 4 activation bytes at p broadcast inside the instruction
 * ({1to16}): no broadcast in a register, so no shuffle op beside each pair of products */
typedef int32_t __attribute__((may_alias)) bytes4_t; /* 4 of the int8 activation codes */
static inline __attribute__((always_inline)) vi_t dot_at(vi_t acc, vi_t u, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const bytes4_t *)p));
    return acc;
}
#define DOT_AT 1
/* acc - the int32 at p, and v * the float at p, each broadcast by the instruction itself */
static inline __attribute__((always_inline)) vi_t sub_at(vi_t acc, const int32_t *p) {
    __asm__("vpsubd %1%{1to16%}, %0, %0" : "+v"(acc) : "m"(*p));
    return acc;
}
static inline __attribute__((always_inline)) vf_t mul_at(vf_t v, const float *p) {
    __asm__("vmulps %1%{1to16%}, %0, %0" : "+v"(v) : "m"(*p));
    return v;
}
#endif
#else /* vpmaddubsw pair sums: |2 * 15 * 128| < 2^15, never saturated */
#define DOT_SMALL(acc, u, x) VADD32((acc), VMADDUBS((u), (x)))
/* Byte panels as int16 pairs: per 32-bit lane (one row, channels 0-3) the unsigned codes' even
 * bytes (u0, u2: a mask) and odd ones (u1, u3: a shift), zero-extended, are two vpmaddwd operands
 * against the activations' (x0, x2) and (x1, x3), which to_int8 lays out once per call (|u x| <=
 * 255 * 128, so no pair sum overflows). 4 operations per token and vector instead of the nibble
 * split's 7 (2 vpmaddubsw, 2 vpmaddwd, a shift, 2 adds), and the same sum(u x). */
#define BYTES16 1
#if I8_SIMD == 512
#define VEVEN16(v) _mm512_and_si512((v), _mm512_set1_epi16(0x00FF))
#define VODD16(v) _mm512_srli_epi16((v), 8)
#else
#define VEVEN16(v) _mm256_and_si256((v), _mm256_set1_epi16(0x00FF))
#define VODD16(v) _mm256_srli_epi16((v), 8)
#endif
#endif

/* The exact products of mr tokens x nv vectors of rows over channels [a, b), into acc. */
static inline __attribute__((always_inline)) void dot_tile(vi_t acc[MR][NV], const uint8_t *w, int nibbles,
                                                           int64_t kp, const int8_t *x, const int16_t *x16,
                                                           int64_t xstride, int64_t r0, int64_t a, int64_t b,
                                                           const int mr, const int nv) {
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) acc[m][v] = VZERO();
    if (nibbles) {
        for (int64_t k = a; k < b; k += 8) {
            vi_t lo[NV], hi[NV];
            for (int v = 0; v < nv; v++) {
                vi_t raw = panel_load(w, r0 + v * VL, k, kp, 1);
                lo[v] = VMASK4(raw), hi[v] = VSHR4(raw);
            }
            /* the low channels of every token, then the high ones: one dot product per statement (nested,
             * GCC 12 copied about 20 accumulators between registers every step, now about 6) */
#ifdef DOT_AT
            for (int m = 0; m < mr; m++)
                for (int v = 0; v < nv; v++) acc[m][v] = dot_at(acc[m][v], lo[v], x + m * xstride + k);
            for (int m = 0; m < mr; m++)
                for (int v = 0; v < nv; v++) acc[m][v] = dot_at(acc[m][v], hi[v], x + m * xstride + k + 4);
#else
            for (int m = 0; m < mr; m++) {
                vi_t x0 = VBCAST32(x + m * xstride + k);
                for (int v = 0; v < nv; v++) acc[m][v] = DOT_SMALL(acc[m][v], lo[v], x0);
            }
            for (int m = 0; m < mr; m++) {
                vi_t x1 = VBCAST32(x + m * xstride + k + 4);
                for (int v = 0; v < nv; v++) acc[m][v] = DOT_SMALL(acc[m][v], hi[v], x1);
            }
#endif
        }
    } else {
#ifdef BYTES16
        (void)x;
        for (int64_t k = a; k < b; k += 4) {
            vi_t ev[NV], ov[NV];
            for (int v = 0; v < nv; v++) {
                vi_t u = panel_load(w, r0 + v * VL, k, kp, 0);
                ev[v] = VEVEN16(u), ov[v] = VODD16(u);
            }
            for (int m = 0; m < mr; m++) {
                vi_t xe = VBCAST32(x16 + m * xstride + k), xo = VBCAST32(x16 + m * xstride + k + 2);
                for (int v = 0; v < nv; v++) acc[m][v] = VADD32(VADD32(acc[m][v], VMADDWD(ev[v], xe)), VMADDWD(ov[v], xo));
            }
        }
#else
        (void)x16;
        for (int64_t k = a; k < b; k += 4) {
            vi_t wv[NV];
            for (int v = 0; v < nv; v++) wv[v] = panel_load(w, r0 + v * VL, k, kp, 0);
#ifdef DOT_AT
            for (int m = 0; m < mr; m++)
                for (int v = 0; v < nv; v++) acc[m][v] = dot_at(acc[m][v], wv[v], x + m * xstride + k);
#else
            for (int m = 0; m < mr; m++) {
                vi_t xb = VBCAST32(x + m * xstride + k);
                for (int v = 0; v < nv; v++) acc[m][v] = DOT_BYTE(acc[m][v], wv[v], xb);
            }
#endif
        }
#endif
    }
}

/* y rows [r0, r0 + nv * VL) for tokens [i0, i0 + mr). */
static inline __attribute__((always_inline)) void tile(const struct i8_args *A, int64_t i0, int64_t r0, const int mr,
                                                       const int nv) {
    vi_t acc[MR][NV];
    vf_t f[MR][NV];
    const int64_t ng = A->ng;
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) f[m][v] = FZERO();
    for (int64_t g = 0; g < ng; g++) {
        int64_t a = g * A->group, b = a + A->group < A->kp ? a + A->group : A->kp;
        dot_tile(acc, A->w, A->nibbles, A->kp, A->x + i0 * A->kp, A->x16 ? A->x16 + i0 * A->kp : NULL, A->kp, r0, a,
                 b, mr, nv);
        for (int v = 0; v < nv; v++) {
            int64_t r = r0 + v * VL;
            vf_t swv = FLOAD(A->sw + ((r / PANEL) * ng + g) * PANEL + r % PANEL);
            for (int m = 0; m < mr; m++) {
                int64_t q = (i0 + m) * ng + g;
#ifdef DOT_AT
                f[m][v] = FMA(FCVT(sub_at(acc[m][v], A->zx + q)), mul_at(swv, A->sx + q), f[m][v]);
#else
                vi_t p = VSUB32(acc[m][v], VSET32(A->zx[q]));
                f[m][v] = FMA(FCVT(p), FMUL(swv, FSET(A->sx[q])), f[m][v]);
#endif
            }
        }
    }
    if (A->wo) {
        dot_tile(acc, A->wo, 0, A->kpo, A->xo + i0 * A->kpo, A->xo16 ? A->xo16 + i0 * A->kpo : NULL, A->kpo, r0, 0,
                 A->kpo, mr, nv);
        for (int v = 0; v < nv; v++) {
            int64_t r = r0 + v * VL;
            vf_t swv = FLOAD(A->swo + r);
            for (int m = 0; m < mr; m++) {
                vi_t p = VSUB32(acc[m][v], VSET32(A->zxo[i0 + m]));
                f[m][v] = FADD(f[m][v], FMA(FCVT(p), FMUL(swv, FSET(A->sxo[i0 + m])), FZERO()));
            }
        }
    }
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) {
            if (A->y_bf16) {
                float tmp[VL];
                FSTORE(tmp, f[m][v]);
                out_row(A, i0 + m, r0 + v * VL, tmp, VL);
            } else
                FSTORE((float *)A->y + (i0 + m) * A->out + r0 + v * VL, f[m][v]);
        }
}

#define TILE_CASES(NVC)                                                                                          \
    switch (mr) {                                                                                                \
    case MR: tile(A, i, r0, MR, NVC); break;                                                                     \
    case MR - 1: tile(A, i, r0, MR - 1, NVC); break;                                                             \
    case MR - 2: tile(A, i, r0, MR - 2, NVC); break;                                                             \
    case MR - 3: tile(A, i, r0, MR - 3, NVC); break;                                                             \
    default: for (int64_t j = i; j < i + mr; j++) tile(A, j, r0, 1, NVC);                                        \
    }

/* One work item: NV vectors of rows (fewer at the end), every token. */
static void i8_item(const void *ctx, int64_t item) {
    const struct i8_args *A = ctx;
    const int64_t r0 = item * NV * VL;
    const int nv = (A->out - r0) / VL < NV ? (int)((A->out - r0) / VL) : NV;
    for (int64_t i = 0; i < A->t; i += MR) {
        const int mr = A->t - i < MR ? (int)(A->t - i) : MR;
        if (nv == NV) {
            TILE_CASES(NV)
        } else {
            TILE_CASES(1)
        }
    }
}
#define I8_ROWS_PER_ITEM (NV * VL)
#else
/* Portable: the same exact integers, the same float steps in the same order, one row at a time. */
static void i8_item(const void *ctx, int64_t item) {
    const struct i8_args *A = ctx;
    for (int64_t r = item * PANEL; r < (item + 1) * PANEL; r++)
        for (int64_t i = 0; i < A->t; i++) {
            float f = 0.f;
            for (int64_t g = 0; g < A->ng; g++) {
                int64_t a = g * A->group, b = a + A->group < A->kp ? a + A->group : A->kp, q = i * A->ng + g;
                int32_t p = (int32_t)(panel_dot(A->w, A->nibbles, A->kp, r, a, b, A->x + i * A->kp, 1) - (uint32_t)A->zx[q]);
                f = fmaf((float)p, A->sw[((r / PANEL) * A->ng + g) * PANEL + r % PANEL] * A->sx[q], f);
            }
            if (A->wo) {
                int32_t p = (int32_t)(panel_dot(A->wo, 0, A->kpo, r, 0, A->kpo, A->xo + i * A->kpo, 1) - (uint32_t)A->zxo[i]);
                f = f + fmaf((float)p, A->swo[r] * A->sxo[i], 0.f);
            }
            out_row(A, i, r, &f, 1);
        }
}
#define I8_ROWS_PER_ITEM PANEL
#endif

#include "i8_amx.h"

/* 1 where this build runs AMX-INT8 tiles (from AMX_MIN_T tokens on) and the OS granted tile state. */
int i8_gemm_amx(void) {
#if I8_AMX
    return amx_ready();
#else
    return 0;
#endif
}

/* int16 codes [t, n] (row stride ns) -> int8 [t, kp] zero padded; zx [t, ng] = zero * each group's sum;
 * with x16 (BYTES16 byte panels) also the int16 pairs [t, kp]: per 4 channels x0, x2, x1, x3. */
static void to_int8(const int16_t *q, int64_t ns, int64_t t, int64_t n, int64_t kp, int64_t group, int64_t ng,
                    int32_t zero, int8_t *x, int32_t *zx, int16_t *x16) {
    for (int64_t i = 0; i < t; i++) {
        int8_t *xr = x + i * kp;
        for (int64_t k = 0; k < n; k++) xr[k] = (int8_t)q[i * ns + k];
        for (int64_t k = n; k < kp; k++) xr[k] = 0;
        if (x16)
            for (int64_t k = 0; k < kp; k += 4) {
                int16_t *o = x16 + i * kp + k;
                o[0] = xr[k], o[1] = xr[k + 2], o[2] = xr[k + 1], o[3] = xr[k + 3];
            }
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * group, b = a + group < kp ? a + group : kp;
            uint32_t s = 0;
            for (int64_t k = a; k < b; k++) s += (uint32_t)(int32_t)xr[k];
            zx[i * ng + g] = (int32_t)(s * (uint32_t)zero);
        }
    }
}

/* The per-token passes before the products, shared out over the work pool by blocks of tokens (a
 * token's bytes never depend on which thread wrote them). */
#define TOKENS_PER_ITEM 8

struct int8_job {
    const int16_t *q;
    int64_t t, ns, n, kp, group, ng;
    int32_t zero;
    int8_t *x;
    int32_t *zx;
    int16_t *x16; /* NULL: no int16 pairs */
};

static void int8_item(const void *ctx, int64_t item) {
    const struct int8_job *J = ctx;
    const int64_t i0 = item * TOKENS_PER_ITEM, cnt = J->t - i0 < TOKENS_PER_ITEM ? J->t - i0 : TOKENS_PER_ITEM;
    to_int8(J->q + i0 * J->ns, J->ns, cnt, J->n, J->kp, J->group, J->ng, J->zero, J->x + i0 * J->kp,
            J->zx + i0 * J->ng, J->x16 ? J->x16 + i0 * J->kp : NULL);
}

/* The per-token passes of one call fused into items of `block` tokens: the codes (act_sym.h) where
 * the call computes them (with the layer's input reorder), their int8 form and group sums (to_int8)
 * and, for a call on AMX tiles, its packed A tiles: one fork/join of the threads instead of up to
 * five, each token's values still in cache between the passes. Every pass is per token, so the same
 * bytes as the passes one after another. Items of 32 tokens, but of 8 in a call of 9-32 tokens
 * not on AMX tiles (whose A tiles take rows of 32): one item of 32 left these passes to one thread
 * while the others waited (measured: 1.02-1.08x at 16-32 tokens; items of 8 at 64-128 tokens
 * were 0.95x). */
#define PREP_TOKENS 32
#define PREP_TOKENS_SMALL TOKENS_PER_ITEM
_Static_assert(PREP_TOKENS % TOKENS_PER_ITEM == 0, "a prep item holds whole int8 items");
struct prep_job {
    struct act_sym_job *S; /* NULL: the codes are given; else its block is set to `block` */
    struct int8_job I, O;  /* O: the outliers, when `outliers` */
    int outliers, amx;
    int64_t t, block;
#if I8_AMX
    struct rows_job R, RO; /* when `amx` */
#endif
};

static void prep_item(const void *ctx, int64_t item) {
    const struct prep_job *P = ctx;
    if (P->S) act_sym_item(P->S, item);
    for (int64_t s = item * (P->block / TOKENS_PER_ITEM); s < (item + 1) * (P->block / TOKENS_PER_ITEM); s++) {
        if (s * TOKENS_PER_ITEM >= P->t) break;
        int8_item(&P->I, s);
        if (P->outliers) int8_item(&P->O, s);
    }
#if I8_AMX
    if (P->amx) {
        amx_rows_item(&P->R, item);
        if (P->outliers) amx_rows_item(&P->RO, item);
    }
#endif
}

/* y [t, out] float32 = the groups' rescaled exact products of INT8/INT4 codes xq [t, kp] (int16,
 * |code| <= 128; scales sx [t, ng]) with the panels w (zero point `zero`, scales sw), plus, when wo
 * is not NULL, the INT8 outlier part: codes xo [t, ko] (int16), scales sxo [t], panels wo over kpo
 * channels, row scales swo [out]. out a multiple of 16; kp of 8 (4-bit) or 4; group of 8 or 4.
 * With S not NULL the codes are S's, computed here in the same work items. Returns 0, -1 if out of
 * memory, -2 if S found a NaN or Inf. */
static int i8_gemm_to(const uint8_t *w, int nibbles, const float *sw, int32_t zero, int64_t out, int64_t kp,
                      int64_t group, int64_t ng, const int16_t *xq, const float *sx, int64_t t, const uint8_t *wo,
                      const float *swo, int64_t kpo, const int16_t *xo, int64_t ko, const float *sxo,
                      struct act_sym_job *S, void *y, int y_bf16, int threads) {
    if (t <= 0) return 0;
#ifdef BYTES16
    const int pairs = 1; /* byte panels (INT8 weights, outliers) as int16 pairs: see BYTES16 */
#else
    const int pairs = 0;
#endif
    const int64_t n16 = pairs ? (nibbles ? 0 : t * kp) + (wo ? t * kpo : 0) : 0;
    int8_t *x = malloc((size_t)(t * kp) + (size_t)(wo ? t * kpo : 0) + 64);
    int32_t *zx = malloc((size_t)(t * ng + t) * sizeof(int32_t));
    int16_t *x16 = n16 ? malloc((size_t)n16 * sizeof(int16_t)) : NULL;
    if (!x || !zx || (n16 && !x16)) {
        free(x), free(zx), free(x16);
        return -1;
    }
    int16_t *xm16 = pairs && !nibbles ? x16 : NULL, *xo16 = pairs && wo ? x16 + (nibbles ? 0 : t * kp) : NULL;
    struct prep_job P = {.S = S, .I = {xq, t, kp, kp, kp, group, ng, zero, x, zx, xm16},
                         .outliers = wo != NULL, .t = t, .block = t <= PREP_TOKENS ? PREP_TOKENS_SMALL : PREP_TOKENS};
    struct i8_args A = {w, sw, out, kp, group, ng, t, zero, nibbles, x, sx, zx, xm16, NULL, NULL, NULL, 0, NULL, NULL,
                        NULL, y, y_bf16};
    if (wo) {
        P.O = (struct int8_job){xo, t, ko, ko, kpo, kpo, 1, 128, x + t * kp, zx + t * ng, xo16};
        A.wo = wo, A.swo = swo, A.kpo = kpo, A.xo = x + t * kp, A.sxo = sxo, A.zxo = zx + t * ng, A.xo16 = xo16;
    }
#if I8_AMX
    struct amx_args M;
    P.amx = t >= AMX_MIN_T(nibbles) && !amx_begin(&A, &M);
    if (P.amx) amx_rows_jobs(&M, &P.R, &P.RO), P.block = PREP_TOKENS;
#endif
    if (S) S->block = P.block;
    pool_run(prep_item, &P, (t + P.block - 1) / P.block, threads);
    const int bad = S && atomic_load(&S->bad);
#if I8_AMX
    if (P.amx && bad) amx_act_release((uint8_t *)M.xa);
    if (P.amx && !bad) amx_finish(&M, threads);
#endif
    if (!P.amx && !bad) pool_run(i8_item, &A, (out + I8_ROWS_PER_ITEM - 1) / I8_ROWS_PER_ITEM, threads);
    free(x), free(zx), free(x16);
    return bad ? -2 : 0;
}

int i8_gemm(const uint8_t *w, int nibbles, const float *sw, int32_t zero, int64_t out, int64_t kp, int64_t group,
            int64_t ng, const int16_t *xq, const float *sx, int64_t t, const uint8_t *wo, const float *swo,
            int64_t kpo, const int16_t *xo, int64_t ko, const float *sxo, float *y, int threads) {
    return i8_gemm_to(w, nibbles, sw, zero, out, kp, group, ng, xq, sx, t, wo, swo, kpo, xo, ko, sxo, NULL, y, 0,
                      threads);
}

/* The outputs' rounding to bfloat16 (f32_to_bf16_row, this build's vector width) on its own, so that
 * its ties, NaN, Inf and subnormals can be checked against torch's in every build. */
void i8_round_bf16(const float *src, uint16_t *dst, int64_t n) { f32_to_bf16_row(dst, src, n); }

/* The integer kinds' activation codes (act_sym.h) for this library's callers. */
ACT_SYM_EXPORT(i8_act_sym)

/* A layer's input reorder, checked, narrowed to the gathers' int32 indices and planned
 * (row_order.h) once, when the layer is prepared: a call through i8_gemm_linear_ordered then spends
 * nothing on its permutation but the reorder itself (checking and planning 576-1536 indices took
 * 2-6 us a call, as long as a whole one-token W4A4 product of the default model's o_proj). The plan
 * is this build's (its vector width), so a caller keeps one per library. */
struct i8_input_order {
    int step; /* the ROW_ORDER_STEP of the build that planned it, first (one offset in every build's
               * layout): another build's plan is refused */
    struct row_order order;
    int32_t *perm32;
};

void i8_input_order_free(void *p) {
    struct i8_input_order *O = p;
    if (!O) return;
    row_order_free(&O->order);
    free(O->perm32);
    free(O);
}

/* *out = the plan of perm [n]; 0, -1 if out of memory, -3 if an index lies outside [0, n). */
int i8_input_order_new(const int64_t *perm, int64_t n, void **out) {
    *out = NULL;
    if (n < 0 || n > INT32_MAX) return -3; /* the gathers take int32 indices */
    struct i8_input_order *O = calloc(1, sizeof *O);
    if (!O) return -1;
    O->step = ROW_ORDER_STEP;
    O->perm32 = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!O->perm32) {
        free(O);
        return -1;
    }
    for (int64_t j = 0; j < n; j++) { /* checked and narrowed in one pass */
        if (perm[j] < 0 || perm[j] >= n) {
            i8_input_order_free(O);
            return -3;
        }
        O->perm32[j] = (int32_t)perm[j];
    }
    if (row_order_plan(&O->order, O->perm32, n)) {
        i8_input_order_free(O);
        return -1;
    }
    *out = O;
    return 0;
}

/* One W8A8 / W4A4 linear, one crossing from Python (a decode step calls every layer): x [t, n_in]
 * float32 (x_bf16 = 0) or bfloat16 (1), read through `order` when it is not NULL (x[:, perm], the
 * layer's input reorder, a plan of i8_input_order_new over n_in channels: the same values, so the
 * same codes), -> per-token codes as i8_act_sym (n normal channels in ng groups of `group` padded to
 * kp, the last n_in - n as INT8 outliers) -> i8_gemm's products -> y [t, out] float32, or bfloat16
 * (y_bf16) rounded as torch's .to(bfloat16). wo NULL: no outlier panels. Returns 0, -1 if out of
 * memory, -2 if a token has a NaN or Inf, -3 if the order is not one of n_in channels. */
int i8_gemm_linear_ordered(const uint8_t *w, int nibbles, const float *sw, int32_t zero, int64_t out, int64_t kp,
                           int64_t group, int64_t ng, const uint8_t *wo, const float *swo, int64_t kpo, int64_t n_in,
                           int64_t n, int bits, float clip, int half, const void *order, const void *x, int x_bf16,
                           int64_t t, void *y, int y_bf16, int threads) {
    const struct i8_input_order *O = order;
    if (O && (O->order.n != n_in || O->step != ROW_ORDER_STEP)) return -3;
    if (t <= 0) return 0;
    const int64_t k = n_in - n;
    const size_t esz = x_bf16 ? 2 : 4;
    void *xg = O ? malloc((size_t)(t * n_in) * esz) : NULL;
    int16_t *xq = malloc((size_t)(t * kp + t * k + 1) * sizeof(int16_t));
    float *sx = malloc((size_t)(t * ng + t) * sizeof(float));
    int32_t *xsum = malloc((size_t)(t * ng) * sizeof(int32_t));
    int rc = -1;
    if ((O && !xg) || !xq || !sx || !xsum) goto done;
    int16_t *oq = xq + t * kp;
    float *osx = sx + t * ng;
    struct act_sym_job J = {.x = x, .bf16 = x_bf16, .bits = bits, .half = half, .order = O ? &O->order : NULL, .xg = xg,
                            .t = t, .n_in = n_in, .n = n, .group = group, .ng = ng, .kp = kp, .block = PREP_TOKENS,
                            .clip = clip, .xq = xq, .oq = oq, .sx = sx, .osx = osx, .xsum = xsum};
    rc = i8_gemm_to(w, nibbles, sw, zero, out, kp, group, ng, xq, sx, t, k ? wo : NULL, swo, kpo, oq, k, osx, &J, y,
                    y_bf16, threads);
done:
    free(xg), free(xq), free(sx), free(xsum);
    return rc;
}

/* i8_gemm_linear_ordered with the reorder given as int64 indices perm [n_in] (or NULL), planned for
 * this call alone; -3 if perm holds an index outside [0, n_in). */
int i8_gemm_linear(const uint8_t *w, int nibbles, const float *sw, int32_t zero, int64_t out, int64_t kp,
                   int64_t group, int64_t ng, const uint8_t *wo, const float *swo, int64_t kpo, int64_t n_in,
                   int64_t n, int bits, float clip, int half, const int64_t *perm, const void *x, int x_bf16, int64_t t,
                   void *y, int y_bf16, int threads) {
    if (t <= 0) return 0;
    void *order = NULL;
    int rc = perm ? i8_input_order_new(perm, n_in, &order) : 0;
    if (!rc)
        rc = i8_gemm_linear_ordered(w, nibbles, sw, zero, out, kp, group, ng, wo, swo, kpo, n_in, n, bits, clip, half,
                                    order, x, x_bf16, t, y, y_bf16, threads);
    i8_input_order_free(order);
    return rc;
}
