/* INT8-weight matrix products for small batches on CPU (decode).
 *
 * Without VNNI/AMX torch's _int_mm is a slow generic loop on this hardware, and the float32
 * SGEMM route stores the weight as 4-byte floats. Here the weight stays 1 byte per value: row-major
 * [out, kp], rows padded to kp (a multiple of 32) with zeros and to a multiple of 4 (the plain layout
 * torch._int_mm also reads, so large batches can use it on the same bytes). Codes are sign-extended
 * to int16 and multiplied with int16 activation codes (vpmaddwd, or vpdpwssd with VNNI).
 *
 * Activation codes come in blocks of `block` channels, each with its own scale sx[t, g]; per
 * (token, row, block) the product P is an exact int32, and y = sum over blocks of
 * float(P) * (w_scale * sx), fused multiply-adds in block order.
 * - W8A8 (w8_gemv_codes): INT8 codes per token, one block (|P| <= kp * 127 * 128): the float32
 *   rescale float(P) * (w_scale * x_scale), the same bits as the float-SGEMM and _int_mm methods.
 * - W8A16 (w8_linear): activations rounded here to int16 per block of A16_BLOCK channels.
 * The same bits from the portable path, any batch and any thread count (tested).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "row_blocks.h"

#if defined(__AVX2__) && !defined(W8_NO_SIMD)
#define W8_SIMD 1
#else
#define W8_SIMD 0
#endif
#define ACT_SIMD W8_SIMD
#include "act_int16.h"
#include "act_sym.h"

/* int16 activation codes per block: |P| <= 256 * 127 * 32767 < 2^31 */
#define A16_BLOCK 256

int w8_has_simd(void) { return W8_SIMD; }

#if W8_SIMD
/* A prefetch `off` bytes past p, the address formed as an integer: past the last block it points
 * beyond the weights (a prefetch never faults), which pointer arithmetic may not. */
#define W8_PREFETCH(p, off) _mm_prefetch((const char *)((uintptr_t)(p) + (uintptr_t)(off)), _MM_HINT_T0)

/* acc += the 32 products of one 32-byte chunk of codes with 32 int16 activations */
#define W8_CHUNK(acc, p, xv0, xv1)                                                                        \
    do {                                                                                                \
        __m256i w0_ = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)));                      \
        __m256i w1_ = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((p) + 16)));               \
        acc = MADD_ACC(MADD_ACC(acc, w0_, xv0), w1_, xv1);                                                \
    } while (0)

/* 4 rows (one block) x 1 token: every activation load serves 4 rows. The 4 rows are 4 streams
 * at once, which the hardware prefetchers follow late: each step prefetches the next block, and
 * a decode call, its weights cold, ran 1.13-1.58x faster for it (AVX2 build, Zen 4, measured). */
static void blocks_one_token(const int8_t *w, const float *s, int64_t kp, int64_t block, int64_t ng,
                             const int16_t *xq, const float *sx, float *y, int64_t b0, int64_t b1) {
    for (int64_t bi = b0; bi < b1; bi++) {
        const int8_t *wb = w + bi * 4 * kp; /* rows 4bi .. 4bi+3, kp apart */
        const __m128 sw = _mm_loadu_ps(s + 4 * bi);
        __m128 f = _mm_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * block, b = a + block < kp ? a + block : kp;
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t j = a; j < b; j += 32) {
                const __m256i *xv = (const __m256i *)(xq + j);
                __m256i x0 = _mm256_loadu_si256(xv), x1 = _mm256_loadu_si256(xv + 1);
                const int8_t *p = wb + j;
                /* the next block's 4 rows, 128 bytes a step: they stream in while this one is used */
                W8_PREFETCH(wb, 4 * kp + 4 * j);
                W8_PREFETCH(wb, 4 * kp + 4 * j + 64);
                W8_CHUNK(a0, p, x0, x1);
                W8_CHUNK(a1, p + kp, x0, x1);
                W8_CHUNK(a2, p + 2 * kp, x0, x1);
                W8_CHUNK(a3, p + 3 * kp, x0, x1);
            }
            f = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4x8(a0, a1, a2, a3)), _mm_mul_ps(sw, _mm_set1_ps(sx[g])), f);
        }
        _mm_storeu_ps(y + 4 * bi, f);
    }
}

/* 1 row x 4 tokens: each chunk of codes is sign-extended once for the 4 tokens */
static void rows_four_tokens(const int8_t *w, const float *s, int64_t kp, int64_t block, int64_t ng,
                             const int16_t *xq, const float *sx, float *y, int64_t out, int64_t b0, int64_t b1) {
    for (int64_t o = 4 * b0; o < 4 * b1; o++) {
        const int8_t *wr = w + o * kp;
        __m128 f = _mm_setzero_ps(); /* lanes: the 4 tokens */
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * block, b = a + block < kp ? a + block : kp;
            __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                              _mm256_setzero_si256()};
            for (int64_t j = a; j < b; j += 32) {
                const int8_t *p = wr + j;
                W8_PREFETCH(p, 4 * kp); /* the row 4 ahead, as this one streams */
                __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
                __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
                for (int i = 0; i < 4; i++) {
                    const __m256i *xv = (const __m256i *)(xq + i * kp + j);
                    acc[i] = MADD_ACC(MADD_ACC(acc[i], w0, _mm256_loadu_si256(xv)), w1, _mm256_loadu_si256(xv + 1));
                }
            }
            __m128 scale = _mm_mul_ps(_mm_set1_ps(s[o]), _mm_setr_ps(sx[g], sx[ng + g], sx[2 * ng + g], sx[3 * ng + g]));
            f = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4x8(acc[0], acc[1], acc[2], acc[3])), scale, f);
        }
        float r[4];
        _mm_storeu_ps(r, f);
        for (int i = 0; i < 4; i++) y[i * out + o] = r[i];
    }
}
#else
/* Portable path: the same exact block sums and the same float steps (fmaf in block order) */
static void rows_portable(const int8_t *w, const float *s, int64_t kp, int64_t block, int64_t ng,
                          const int16_t *xq, const float *sx, float *y, int64_t b0, int64_t b1) {
    for (int64_t o = 4 * b0; o < 4 * b1; o++) {
        const int8_t *wr = w + o * kp;
        float f = 0.f;
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * block, b = a + block < kp ? a + block : kp;
            int32_t acc = 0;
            for (int64_t j = a; j < b; j += 32)
                for (int c = 0; c < 32; c++) acc += wr[j + c] * xq[j + c];
            f = fmaf((float)acc, s[o] * sx[g], f);
        }
        y[o] = f;
    }
}
#endif

struct w8_args {
    const int8_t *w;
    const float *s, *sx;
    const int16_t *xq;
    int64_t out, kp, block, ng, t;
    float *y;
};

static void w8_item(const void *ctx, int64_t b0, int64_t b1) {
    const struct w8_args *a = ctx;
    const int64_t kp = a->kp, ng = a->ng;
    int64_t i = 0;
#if W8_SIMD
    for (; i + 4 <= a->t; i += 4)
        rows_four_tokens(a->w, a->s, kp, a->block, ng, a->xq + i * kp, a->sx + i * ng, a->y + i * a->out, a->out,
                         b0, b1);
    for (; i < a->t; i++)
        blocks_one_token(a->w, a->s, kp, a->block, ng, a->xq + i * kp, a->sx + i * ng, a->y + i * a->out, b0, b1);
#else
    for (; i < a->t; i++)
        rows_portable(a->w, a->s, kp, a->block, ng, a->xq + i * kp, a->sx + i * ng, a->y + i * a->out, b0, b1);
#endif
}

static void w8_blocks(const int8_t *w, const float *s, int64_t out, int64_t kp, int64_t block, const int16_t *xq,
                      const float *sx, int64_t t, float *y, int threads) {
    struct w8_args a = {w, s, sx, xq, out, kp, block, (kp + block - 1) / block, t, y};
    for_row_blocks(out, threads, w8_item, &a);
}

/* W8A8: y [t, out] = float(codes xq [t, kp] . weight rows) * (w_scale[o] * sx[t]); out a multiple of 4 */
void w8_gemv_codes(const int8_t *w, const float *s, int64_t out, int64_t kp, const int16_t *xq, const float *sx,
                   int64_t t, float *y, int threads) {
    w8_blocks(w, s, out, kp, kp, xq, sx, t, y, threads);
}

struct w8_weight {
    const int8_t *w;
    const float *s;
    int64_t out, kp;
};

static void w8_a16_gemv(const void *ctx, const int16_t *xq, const float *sx, const int32_t *xsum, int64_t t,
                        float *y, int threads) {
    const struct w8_weight *m = ctx;
    (void)xsum;
    w8_blocks(m->w, m->s, m->out, m->kp, A16_BLOCK, xq, sx, t, y, threads);
}

/* W8A16 in one call: x [t, k] float32 (x_bf16 = 0) or bfloat16 (1) -> y [t, out] float32 or
 * bfloat16 (y_bf16); out a multiple of 4. Returns 0, or -1 if out of memory. */
int w8_linear(const int8_t *w, const float *s, int64_t out, int64_t kp, int64_t k, const void *x, int x_bf16,
              int64_t t, void *y, int y_bf16, int threads) {
    struct w8_weight m = {w, s, out, kp};
    return a16_linear(w8_a16_gemv, &m, out, k, kp, A16_BLOCK, (kp + A16_BLOCK - 1) / A16_BLOCK, 0, x, x_bf16, t, y,
                      y_bf16, threads);
}

/* The integer kinds' activation codes (act_sym.h) for this library's callers. */
ACT_SYM_EXPORT(w8_act_sym)

/* y [t, out] = float(p[i, r]) * (sx[i] * sw[r]) for an exact int32 product p [t, ldp] (torch's
 * _int_mm on this layout): the GEMV's float step, in one pass over the pool instead of three torch
 * passes with two [t, out] temporaries. */
struct rescale_job {
    const int32_t *p;
    int64_t ldp, out;
    const float *sx, *sw;
    float *y;
};

static void rescale_item(const void *ctx, int64_t i) {
    const struct rescale_job *J = ctx;
    const int32_t *p = J->p + i * J->ldp;
    float *y = J->y + i * J->out;
    const float s = J->sx[i];
    for (int64_t r = 0; r < J->out; r++) y[r] = (float)p[r] * (s * J->sw[r]);
}

void w8_rescale(const int32_t *p, int64_t ldp, const float *sx, const float *sw, int64_t t, int64_t out, float *y,
                int threads) {
    struct rescale_job J = {p, ldp, out, sx, sw, y};
    pool_run(rescale_item, &J, t, threads);
}
