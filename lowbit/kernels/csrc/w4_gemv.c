/* 4-bit-weight matrix products for small batches on CPU (decode), where torch's packed-int4
 * matmul runs far below memory bandwidth. Used by W4A16 (activations rounded here to int16) and
 * W4A4 (activations already INT4 codes).
 *
 * Weights: unsigned 4-bit codes u, value (u - z) * s per group; two per byte; rows padded to kp
 * (a multiple of 64) with code 0 and to a multiple of 4 with zero scales. Rows go in blocks of 4,
 * interleaved 32 bytes (64 channels) at a time, so a block is one sequential stream. Within a
 * chunk the nibbles sit where masking, a 4-bit shift and AVX2's per-lane byte unpacks turn them
 * into four int16 vectors of 16 consecutive channels (lowbit/kernels/cpu_w4_gemv.py, ``pack``).
 * Scales and zero points are stored [out/4, groups, 4]: one load per block and group.
 *
 * Arithmetic: per (row, group) the product P = sum((u - z) * xq) is exact in int32 (vpmaddwd,
 * then z * sum(xq) subtracted as an integer); the only roundings are float32: y = sum over groups
 * of float(P) * (s * sx), fused multiply-adds in group order. A token's result is the same bits
 * whatever batch it comes in and however many threads run (tested).
 *
 * Threads: the work pool over output rows (row_blocks.h, work_pool.h), torch.get_num_threads() of them.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "row_blocks.h"

#if defined(__AVX2__) && !defined(W4_NO_SIMD)
#define W4_SIMD 1
#else
#define W4_SIMD 0
#endif
#define ACT_SIMD W4_SIMD
#include "act_int16.h"
#include "act_sym.h"

int w4_has_simd(void) { return W4_SIMD; }


#if W4_SIMD
#ifndef W4_PF
/* Bytes ahead of the codes being read that each step asks the caches for. The hardware's stream
 * prefetcher stops at every 4 KB page, and a block of 4 rows is 2 kp bytes (8 KB at 4096
 * channels): measured on 4096² at one token, 2 threads, weights from memory (40 copies rotated,
 * AMX Xeon, interleaved medians of 200): 0.72-0.80 ms without, 0.50-0.53 ms at 2048 (1024: 0.56,
 * 4096: 0.52-0.53, 8192: 0.54), in the AVX-512 and AVX2 builds alike. */
#define W4_PF 2048
#endif
/* acc += the 64 products of one 32-byte chunk of codes with 64 int16 activations. */
#define W4_CHUNK(acc, p, xv0, xv1, xv2, xv3)                                                   \
    do {                                                                                     \
        __m256i v_ = _mm256_loadu_si256((const __m256i *)(p));                               \
        __m256i lo_ = _mm256_and_si256(v_, m4);                                              \
        __m256i hi_ = _mm256_and_si256(_mm256_srli_epi16(v_, 4), m4);                        \
        acc = MADD_ACC(acc, _mm256_unpacklo_epi8(lo_, zero), xv0); \
        acc = MADD_ACC(acc, _mm256_unpackhi_epi8(lo_, zero), xv1); \
        acc = MADD_ACC(acc, _mm256_unpacklo_epi8(hi_, zero), xv2); \
        acc = MADD_ACC(acc, _mm256_unpackhi_epi8(hi_, zero), xv3); \
    } while (0)

/* y[o..o+3] for the 4-row blocks [b0, b1) and one token: every activation load serves 4 rows. */
static void blocks_one_token(const uint8_t *w, const float *s4, const int32_t *z4, int64_t kp, int64_t group,
                             int64_t ng, const int16_t *xq, const float *sx, const int32_t *xsum, float *y,
                             int64_t b0, int64_t b1) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    for (int64_t bi = b0; bi < b1; bi++) {
        const uint8_t *wb = w + bi * 2 * kp;
        __m128 f = _mm_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * group, b = a + group < kp ? a + group : kp;
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t j = a; j < b; j += 64) {
                const __m256i *xv = (const __m256i *)(xq + j);
                const uint8_t *p = wb + 2 * j;
                _mm_prefetch((const char *)p + W4_PF, _MM_HINT_T0);
                _mm_prefetch((const char *)p + W4_PF + 64, _MM_HINT_T0);
                __m256i x0 = _mm256_loadu_si256(xv), x1 = _mm256_loadu_si256(xv + 1);
                __m256i x2 = _mm256_loadu_si256(xv + 2), x3 = _mm256_loadu_si256(xv + 3);
                W4_CHUNK(a0, p, x0, x1, x2, x3);
                W4_CHUNK(a1, p + 32, x0, x1, x2, x3);
                W4_CHUNK(a2, p + 64, x0, x1, x2, x3);
                W4_CHUNK(a3, p + 96, x0, x1, x2, x3);
            }
            const int64_t q = (bi * ng + g) * 4;
            __m128i zs = _mm_mullo_epi32(_mm_loadu_si128((const __m128i *)(z4 + q)), _mm_set1_epi32(xsum[g]));
            __m128i prod = _mm_sub_epi32(hsum4x8(a0, a1, a2, a3), zs);
            __m128 scale = _mm_mul_ps(_mm_loadu_ps(s4 + q), _mm_set1_ps(sx[g]));
            f = _mm_fmadd_ps(_mm_cvtepi32_ps(prod), scale, f);
        }
        _mm_storeu_ps(y + 4 * bi, f);
    }
}

/* y[i, o] for the rows of blocks [b0, b1) and 4 tokens: each row's codes are unpacked once for
 * the 4 tokens. Per (row, token) the integer and float steps are those of blocks_one_token. */
static void rows_four_tokens(const uint8_t *w, const float *s4, const int32_t *z4, int64_t kp, int64_t group,
                             int64_t ng, const int16_t *xq, const float *sx, const int32_t *xsum, float *y,
                             int64_t out, int64_t b0, int64_t b1) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    for (int64_t o = 4 * b0; o < 4 * b1; o++) {
        const uint8_t *wr = w + (o / 4) * 2 * kp + (o % 4) * 32;
        __m128 f = _mm_setzero_ps(); /* lanes: the 4 tokens */
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * group, b = a + group < kp ? a + group : kp;
            __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                              _mm256_setzero_si256()};
            for (int64_t j = a; j < b; j += 64) {
                _mm_prefetch((const char *)wr + 2 * j + W4_PF, _MM_HINT_T0);
                __m256i v = _mm256_loadu_si256((const __m256i *)(wr + 2 * j));
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                __m256i w0 = _mm256_unpacklo_epi8(lo, zero), w1 = _mm256_unpackhi_epi8(lo, zero);
                __m256i w2 = _mm256_unpacklo_epi8(hi, zero), w3 = _mm256_unpackhi_epi8(hi, zero);
                for (int i = 0; i < 4; i++) {
                    const __m256i *xv = (const __m256i *)(xq + i * kp + j);
                    acc[i] = MADD_ACC(acc[i], w0, _mm256_loadu_si256(xv));
                    acc[i] = MADD_ACC(acc[i], w1, _mm256_loadu_si256(xv + 1));
                    acc[i] = MADD_ACC(acc[i], w2, _mm256_loadu_si256(xv + 2));
                    acc[i] = MADD_ACC(acc[i], w3, _mm256_loadu_si256(xv + 3));
                }
            }
            const int64_t q = ((o / 4) * ng + g) * 4 + o % 4;
            __m128i xs = _mm_setr_epi32(xsum[g], xsum[ng + g], xsum[2 * ng + g], xsum[3 * ng + g]);
            __m128i prod = _mm_sub_epi32(hsum4x8(acc[0], acc[1], acc[2], acc[3]), _mm_mullo_epi32(xs, _mm_set1_epi32(z4[q])));
            __m128 scale = _mm_mul_ps(_mm_set1_ps(s4[q]), _mm_setr_ps(sx[g], sx[ng + g], sx[2 * ng + g], sx[3 * ng + g]));
            f = _mm_fmadd_ps(_mm_cvtepi32_ps(prod), scale, f);
        }
        float r[4];
        _mm_storeu_ps(r, f);
        for (int i = 0; i < 4; i++) y[i * out + o] = r[i];
    }
}
#endif

#if !W4_SIMD
/* Portable path (no AVX2): the same exact group products, nibble by nibble, and the same float
 * steps (fmaf in group order). */
static void rows_portable(const uint8_t *w, const float *s4, const int32_t *z4, int64_t kp, int64_t group,
                          int64_t ng, const int16_t *xq, const float *sx, const int32_t *xsum, float *y,
                          int64_t b0, int64_t b1) {
    for (int64_t o = 4 * b0; o < 4 * b1; o++) {
        const uint8_t *wr = w + (o / 4) * 2 * kp + (o % 4) * 32;
        float f = 0.f;
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * group, b = a + group < kp ? a + group : kp;
            int32_t acc = 0;
            for (int64_t j = a; j < b; j += 64) {
                const uint8_t *p = wr + 2 * j;
                const int16_t *xv = xq + j;
                /* chunk byte c: low nibble is channel L(c), high nibble channel L(c) + 32 */
                for (int c = 0; c < 32; c++) {
                    int lane = c & 15, half = c >> 4; /* 128-bit half of the 256-bit vector */
                    int ch = (lane >> 3) * 16 + half * 8 + (lane & 7);
                    acc += (p[c] & 15) * xv[ch] + (p[c] >> 4) * xv[ch + 32];
                }
            }
            const int64_t q = ((o / 4) * ng + g) * 4 + o % 4;
            f = fmaf((float)(acc - z4[q] * xsum[g]), s4[q] * sx[g], f);
        }
        y[o] = f;
    }
}
#endif

struct w4_args {
    const uint8_t *w;
    const float *s4, *sx;
    const int32_t *z4, *xsum;
    const int16_t *xq;
    int64_t out, kp, group, ng, t;
    float *y;
};

static void w4_item(const void *ctx, int64_t b0, int64_t b1) {
    const struct w4_args *a = ctx;
    const int64_t kp = a->kp, ng = a->ng;
    int64_t i = 0;
#if W4_SIMD
    /* 4 tokens at a time share each unpack; the rest one by one, 4 rows sharing each load */
    for (; i + 4 <= a->t; i += 4)
        rows_four_tokens(a->w, a->s4, a->z4, kp, a->group, ng, a->xq + i * kp, a->sx + i * ng, a->xsum + i * ng,
                         a->y + i * a->out, a->out, b0, b1);
    for (; i < a->t; i++)
        blocks_one_token(a->w, a->s4, a->z4, kp, a->group, ng, a->xq + i * kp, a->sx + i * ng, a->xsum + i * ng,
                         a->y + i * a->out, b0, b1);
#else
    for (; i < a->t; i++)
        rows_portable(a->w, a->s4, a->z4, kp, a->group, ng, a->xq + i * kp, a->sx + i * ng, a->xsum + i * ng,
                      a->y + i * a->out, b0, b1);
#endif
}

/* y [t, out] = the products of activation codes xq [t, kp] (scales sx, code sums xsum [t, ng])
 * with the packed weights; out a multiple of 4. */
void w4_gemv_codes(const uint8_t *w, const float *s4, const int32_t *z4, int64_t out, int64_t kp, int64_t group,
                   int64_t ng, const int16_t *xq, const float *sx, const int32_t *xsum, int64_t t, float *y,
                   int threads) {
    struct w4_args a = {w, s4, sx, z4, xsum, xq, out, kp, group, ng, t, y};
    for_row_blocks(out, threads, w4_item, &a);
}

struct w4_weight {
    const uint8_t *w;
    const float *s4;
    const int32_t *z4;
    int64_t out, kp, group, ng;
};

static void w4_a16_gemv(const void *ctx, const int16_t *xq, const float *sx, const int32_t *xsum, int64_t t,
                        float *y, int threads) {
    const struct w4_weight *m = ctx;
    w4_gemv_codes(m->w, m->s4, m->z4, m->out, m->kp, m->group, m->ng, xq, sx, xsum, t, y, threads);
}

/* The whole W4A16 linear in one call (activations rounded to int16 per weight group): x [t, k]
 * float32 (x_bf16 = 0) or bfloat16 (1) -> y [t, out] float32 or bfloat16 (y_bf16). Returns 0, or
 * -1 if out of memory. */
int w4_linear(const uint8_t *w, const float *s4, const int32_t *z4, int64_t out, int64_t kp, int64_t group,
              int64_t ng, int64_t k, const void *x, int x_bf16, int64_t t, void *y, int y_bf16, int threads) {
    struct w4_weight m = {w, s4, z4, out, kp, group, ng};
    return a16_linear(w4_a16_gemv, &m, out, k, kp, group, ng, 1, x, x_bf16, t, y, y_bf16, threads);
}

/* The integer kinds' activation codes (act_sym.h) for this library's callers. */
ACT_SYM_EXPORT(w4_act_sym)
