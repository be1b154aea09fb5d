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
 * Builds: AVX-512 VNNI (zmm vpdpbusd); AVX-512 BW without VNNI and AVX2 use vpmaddubsw + vpmaddwd,
 * exact because vpmaddubsw's int16 pair sums cannot saturate for 4-bit u (2 * 15 * 128 < 2^15) and
 * 8-bit u is split into two nibbles (sum(u x) = 16 sum(u_hi x) + sum(u_lo x)); AVX-VNNI (ymm
 * vpdpbusd); the portable C loop. Threads: the work pool (work_pool.h) over tiles of rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "work_pool.h"

#if defined(__AVX512BW__) && !defined(I8_NO_SIMD)
#define I8_SIMD 512
#elif defined(__AVX2__) && !defined(I8_NO_SIMD)
#define I8_SIMD 256
#else
#define I8_SIMD 0
#endif
#define ACT_SIMD (I8_SIMD != 0)
#include "act_sym.h"

#define PANEL 16 /* rows per panel */

/* 0: portable loop; 256 / 512: the vector width; +1 when the dot product is a VNNI instruction */
int i8_gemm_simd(void) {
#if I8_SIMD == 512 && defined(__AVX512VNNI__)
    return 513;
#elif I8_SIMD == 256 && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    return 257;
#else
    return I8_SIMD;
#endif
}

struct i8_args {
    const uint8_t *w;   /* panels */
    const float *sw;    /* [out / 16, ng, 16] */
    int64_t out, kp, group, ng, t;
    int32_t zero;
    int nibbles;
    const int8_t *x;    /* [t, kp] */
    const float *sx;    /* [t, ng] */
    const int32_t *zx;  /* [t, ng]: zero * sum of the group's codes */
    /* optional INT8 outliers (wo NULL: none): byte panels [out / 16, kpo / 4, 16, 4], zero 128 */
    const uint8_t *wo;
    const float *swo;   /* [out / 16, 16] */
    int64_t kpo;
    const int8_t *xo;   /* [t, kpo] */
    const float *sxo;   /* [t] */
    const int32_t *zxo; /* [t] */
    float *y;           /* [t, out] */
};

static inline int32_t load32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if I8_SIMD == 512
typedef __m512i vi_t;
typedef __m512 vf_t;
#define VL 16
#ifndef MR
#define MR 6 /* tokens x NV vectors of 16 rows: 12 accumulators, 2 weight vectors, 1 broadcast */
#endif
#ifndef NV
#define NV 2
#endif
#define VLOAD(p) _mm512_loadu_si512((const void *)(p))
#define VBCAST(p) _mm512_set1_epi32(load32(p))
#define VZERO() _mm512_setzero_si512()
#define VMASK4(v) _mm512_and_si512((v), _mm512_set1_epi8(0x0F))
#define VSHR4(v) _mm512_and_si512(_mm512_srli_epi16((v), 4), _mm512_set1_epi8(0x0F))
#define VSUB32(a, b) _mm512_sub_epi32((a), (b))
#define VSET32(v) _mm512_set1_epi32(v)
#define VADD32(a, b) _mm512_add_epi32((a), (b))
#define VSLL4(a) _mm512_slli_epi32((a), 4)
#define VMADDUBS(a, b) _mm512_madd_epi16(_mm512_maddubs_epi16((a), (b)), _mm512_set1_epi16(1))
#define FZERO() _mm512_setzero_ps()
#define FLOAD(p) _mm512_loadu_ps(p)
#define FSTORE(p, v) _mm512_storeu_ps((p), (v))
#define FSET(v) _mm512_set1_ps(v)
#define FMUL(a, b) _mm512_mul_ps((a), (b))
#define FADD(a, b) _mm512_add_ps((a), (b))
#define FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define FCVT(a) _mm512_cvtepi32_ps(a)
#if defined(__AVX512VNNI__)
#define DOT_VNNI 1
#define VDPBUSD(acc, u, x) _mm512_dpbusd_epi32((acc), (u), (x))
#endif
#elif I8_SIMD == 256
typedef __m256i vi_t;
typedef __m256 vf_t;
#define VL 8
#define MR 4
#define NV 2
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VBCAST(p) _mm256_set1_epi32(load32(p))
#define VZERO() _mm256_setzero_si256()
#define VMASK4(v) _mm256_and_si256((v), _mm256_set1_epi8(0x0F))
#define VSHR4(v) _mm256_and_si256(_mm256_srli_epi16((v), 4), _mm256_set1_epi8(0x0F))
#define VSUB32(a, b) _mm256_sub_epi32((a), (b))
#define VSET32(v) _mm256_set1_epi32(v)
#define VADD32(a, b) _mm256_add_epi32((a), (b))
#define VSLL4(a) _mm256_slli_epi32((a), 4)
#define VMADDUBS(a, b) _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), _mm256_set1_epi16(1))
#define FZERO() _mm256_setzero_ps()
#define FLOAD(p) _mm256_loadu_ps(p)
#define FSTORE(p, v) _mm256_storeu_ps((p), (v))
#define FSET(v) _mm256_set1_ps(v)
#define FMUL(a, b) _mm256_mul_ps((a), (b))
#define FADD(a, b) _mm256_add_ps((a), (b))
#define FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define FCVT(a) _mm256_cvtepi32_ps(a)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DOT_VNNI 1
#define VDPBUSD(acc, u, x) _mm256_dpbusd_epi32((acc), (u), (x))
#elif defined(__AVXVNNI__)
#define DOT_VNNI 1
#define VDPBUSD(acc, u, x) _mm256_dpbusd_avx_epi32((acc), (u), (x))
#endif
#endif

#if I8_SIMD
#ifdef DOT_VNNI
#define DOT_SMALL(acc, u, x) VDPBUSD(acc, u, x) /* u <= 15 */
#define DOT_BYTE(acc, u, x) VDPBUSD(acc, u, x)
#else /* vpmaddubsw pair sums: |2 * 15 * 128| < 2^15, never saturated */
#define DOT_SMALL(acc, u, x) VADD32((acc), VMADDUBS((u), (x)))
#define DOT_BYTE(acc, u, x) VADD32((acc), VADD32(VSLL4(VMADDUBS(VSHR4(u), (x))), VMADDUBS(VMASK4(u), (x))))
#endif

/* Offset of vector v's bytes (VL rows starting at row r) at channel k in a panel layout. */
static inline int64_t vec_at(int64_t r, int64_t k, int64_t kp, int nibbles) {
    int64_t panel = r / PANEL, half = (r % PANEL) * 4;
    return nibbles ? (panel * (kp / 8) + k / 8) * 64 + half : (panel * (kp / 4) + k / 4) * 64 + half;
}

/* The exact products of mr tokens x nv vectors of rows over channels [a, b), into acc. */
static inline __attribute__((always_inline)) void dot_tile(vi_t acc[MR][NV], const uint8_t *w, int nibbles,
                                                           int64_t kp, const int8_t *x, int64_t xstride, int64_t r0,
                                                           int64_t a, int64_t b, const int mr, const int nv) {
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++) acc[m][v] = VZERO();
    if (nibbles) {
        for (int64_t k = a; k < b; k += 8) {
            vi_t lo[NV], hi[NV];
            for (int v = 0; v < nv; v++) {
                vi_t raw = VLOAD(w + vec_at(r0 + v * VL, k, kp, 1));
                lo[v] = VMASK4(raw), hi[v] = VSHR4(raw);
            }
            for (int m = 0; m < mr; m++) {
                vi_t x0 = VBCAST(x + m * xstride + k), x1 = VBCAST(x + m * xstride + k + 4);
                for (int v = 0; v < nv; v++) acc[m][v] = DOT_SMALL(DOT_SMALL(acc[m][v], lo[v], x0), hi[v], x1);
            }
        }
    } else {
        for (int64_t k = a; k < b; k += 4) {
            vi_t wv[NV];
            for (int v = 0; v < nv; v++) wv[v] = VLOAD(w + vec_at(r0 + v * VL, k, kp, 0));
            for (int m = 0; m < mr; m++) {
                vi_t xb = VBCAST(x + m * xstride + k);
                for (int v = 0; v < nv; v++) acc[m][v] = DOT_BYTE(acc[m][v], wv[v], xb);
            }
        }
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
        dot_tile(acc, A->w, A->nibbles, A->kp, A->x + i0 * A->kp, A->kp, r0, a, b, mr, nv);
        for (int v = 0; v < nv; v++) {
            int64_t r = r0 + v * VL;
            vf_t swv = FLOAD(A->sw + ((r / PANEL) * ng + g) * PANEL + r % PANEL);
            for (int m = 0; m < mr; m++) {
                int64_t q = (i0 + m) * ng + g;
                vi_t p = VSUB32(acc[m][v], VSET32(A->zx[q]));
                f[m][v] = FMA(FCVT(p), FMUL(swv, FSET(A->sx[q])), f[m][v]);
            }
        }
    }
    if (A->wo) {
        dot_tile(acc, A->wo, 0, A->kpo, A->xo + i0 * A->kpo, A->kpo, r0, 0, A->kpo, mr, nv);
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
        for (int v = 0; v < nv; v++) FSTORE(A->y + (i0 + m) * A->out + r0 + v * VL, f[m][v]);
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
static int32_t dot_row(const uint8_t *w, int nibbles, int64_t kp, const int8_t *x, int64_t r, int64_t a, int64_t b) {
    uint32_t acc = 0; /* wraps as the vector lanes do */
    for (int64_t k = a; k < b; k++) {
        uint32_t u;
        if (nibbles) {
            int64_t j = k % 8, at = (r / PANEL) * (kp / 8) * 64 + (k / 8) * 64 + (r % PANEL) * 4 + (j & 3);
            u = j < 4 ? (w[at] & 15u) : (w[at] >> 4u);
        } else {
            u = w[(r / PANEL) * (kp / 4) * 64 + (k / 4) * 64 + (r % PANEL) * 4 + k % 4];
        }
        acc += u * (uint32_t)(int32_t)x[k];
    }
    return (int32_t)acc;
}

static void i8_item(const void *ctx, int64_t item) {
    const struct i8_args *A = ctx;
    for (int64_t r = item * PANEL; r < (item + 1) * PANEL; r++)
        for (int64_t i = 0; i < A->t; i++) {
            float f = 0.f;
            for (int64_t g = 0; g < A->ng; g++) {
                int64_t a = g * A->group, b = a + A->group < A->kp ? a + A->group : A->kp, q = i * A->ng + g;
                int32_t p = (int32_t)((uint32_t)dot_row(A->w, A->nibbles, A->kp, A->x + i * A->kp, r, a, b) -
                                      (uint32_t)A->zx[q]);
                f = fmaf((float)p, A->sw[((r / PANEL) * A->ng + g) * PANEL + r % PANEL] * A->sx[q], f);
            }
            if (A->wo) {
                int32_t p = (int32_t)((uint32_t)dot_row(A->wo, 0, A->kpo, A->xo + i * A->kpo, r, 0, A->kpo) -
                                      (uint32_t)A->zxo[i]);
                f = f + fmaf((float)p, A->swo[r] * A->sxo[i], 0.f);
            }
            A->y[i * A->out + r] = f;
        }
}
#define I8_ROWS_PER_ITEM PANEL
#endif

/* int16 codes [t, n] (row stride ns) -> int8 [t, kp] zero padded; zx [t, ng] = zero * each group's sum. */
static void to_int8(const int16_t *q, int64_t ns, int64_t t, int64_t n, int64_t kp, int64_t group, int64_t ng,
                    int32_t zero, int8_t *x, int32_t *zx) {
    for (int64_t i = 0; i < t; i++) {
        int8_t *xr = x + i * kp;
        for (int64_t k = 0; k < n; k++) xr[k] = (int8_t)q[i * ns + k];
        for (int64_t k = n; k < kp; k++) xr[k] = 0;
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * group, b = a + group < kp ? a + group : kp;
            uint32_t s = 0;
            for (int64_t k = a; k < b; k++) s += (uint32_t)(int32_t)xr[k];
            zx[i * ng + g] = (int32_t)(s * (uint32_t)zero);
        }
    }
}

/* y [t, out] float32 = the groups' rescaled exact products of INT8/INT4 codes xq [t, kp] (int16,
 * |code| <= 128; scales sx [t, ng]) with the panels w (zero point `zero`, scales sw), plus, when wo
 * is not NULL, the INT8 outlier part: codes xo [t, ko] (int16), scales sxo [t], panels wo over kpo
 * channels, row scales swo [out]. out a multiple of 16; kp of 8 (4-bit) or 4; group of 8 or 4.
 * Returns 0, or -1 if out of memory. */
int i8_gemm(const uint8_t *w, int nibbles, const float *sw, int32_t zero, int64_t out, int64_t kp, int64_t group,
            int64_t ng, const int16_t *xq, const float *sx, int64_t t, const uint8_t *wo, const float *swo,
            int64_t kpo, const int16_t *xo, int64_t ko, const float *sxo, float *y, int threads) {
    if (t <= 0) return 0;
    int8_t *x = malloc((size_t)(t * kp) + (size_t)(t * kpo) + 64);
    int32_t *zx = malloc((size_t)(t * ng + t) * sizeof(int32_t));
    if (!x || !zx) {
        free(x), free(zx);
        return -1;
    }
    to_int8(xq, kp, t, kp, kp, group, ng, zero, x, zx);
    struct i8_args A = {w, sw, out, kp, group, ng, t, zero, nibbles, x, sx, zx, NULL, NULL, 0, NULL, NULL, NULL, y};
    if (wo) {
        int8_t *xo8 = x + t * kp;
        to_int8(xo, ko, t, ko, kpo, kpo, 1, 128, xo8, zx + t * ng);
        A.wo = wo, A.swo = swo, A.kpo = kpo, A.xo = xo8, A.sxo = sxo, A.zxo = zx + t * ng;
    }
    pool_run(i8_item, &A, (out + I8_ROWS_PER_ITEM - 1) / I8_ROWS_PER_ITEM, threads);
    free(x), free(zx);
    return 0;
}

/* The integer kinds' activation codes (act_sym.h) for this library's callers. */
ACT_SYM_EXPORT(i8_act_sym)
