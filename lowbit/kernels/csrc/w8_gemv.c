/* W8A8 matrix products for small batches on CPU (decode): INT8 weights, per-token INT8
 * activation codes, one exact int32 product per (token, row), then one float32 rescale.
 *
 * Without VNNI/AMX torch's _int_mm is a slow generic loop on this hardware, and the float32
 * SGEMM route stores the weight as 4-byte floats. Here the weight stays 1 byte per value: rows
 * padded to kp (a multiple of 32) with zeros and to a multiple of 4, in blocks of 4 rows
 * interleaved 32 bytes at a time (one sequential stream per block). Codes are sign-extended to
 * int16 and multiplied with vpmaddwd: |sum| <= kp * 127 * 128 stays far inside int32.
 * y = float(P) * (w_scale * x_scale): the same bits from the portable path, any batch and any
 * thread count (tested).
 */
#include <stdint.h>
#include <string.h>

#include "row_blocks.h"

#if defined(__AVX2__) && !defined(W8_NO_SIMD)
#define W8_SIMD 1
#else
#define W8_SIMD 0
#endif

int w8_has_simd(void) { return W8_SIMD; }

#if W8_SIMD
/* acc += the 32 products of one 32-byte chunk of codes with 32 int16 activations */
#define W8_CHUNK(acc, p, xv0, xv1)                                                                        \
    do {                                                                                                \
        __m256i w0_ = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)));                      \
        __m256i w1_ = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((p) + 16)));               \
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(w0_, xv0), _mm256_madd_epi16(w1_, xv1))); \
    } while (0)

/* 4 rows (one block) x 1 token: every activation load serves 4 rows */
static void blocks_one_token(const int8_t *w, const float *s, int64_t kp, const int16_t *xq, float sx, float *y,
                             int64_t b0, int64_t b1) {
    for (int64_t bi = b0; bi < b1; bi++) {
        const int8_t *wb = w + bi * 4 * kp;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < kp; j += 32) {
            const __m256i *xv = (const __m256i *)(xq + j);
            __m256i x0 = _mm256_loadu_si256(xv), x1 = _mm256_loadu_si256(xv + 1);
            const int8_t *p = wb + 4 * j;
            W8_CHUNK(a0, p, x0, x1);
            W8_CHUNK(a1, p + 32, x0, x1);
            W8_CHUNK(a2, p + 64, x0, x1);
            W8_CHUNK(a3, p + 96, x0, x1);
        }
        __m128 scale = _mm_mul_ps(_mm_loadu_ps(s + 4 * bi), _mm_set1_ps(sx));
        _mm_storeu_ps(y + 4 * bi, _mm_mul_ps(_mm_cvtepi32_ps(hsum4x8(a0, a1, a2, a3)), scale));
    }
}

/* 1 row x 4 tokens: each chunk of codes is sign-extended once for the 4 tokens */
static void rows_four_tokens(const int8_t *w, const float *s, int64_t kp, const int16_t *xq, const float *sx,
                             float *y, int64_t out, int64_t b0, int64_t b1) {
    for (int64_t o = 4 * b0; o < 4 * b1; o++) {
        const int8_t *wr = w + (o / 4) * 4 * kp + (o % 4) * 32;
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int64_t j = 0; j < kp; j += 32) {
            const int8_t *p = wr + 4 * j;
            __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
            __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
            for (int i = 0; i < 4; i++) {
                const __m256i *xv = (const __m256i *)(xq + i * kp + j);
                acc[i] = _mm256_add_epi32(acc[i], _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xv)),
                                                                   _mm256_madd_epi16(w1, _mm256_loadu_si256(xv + 1))));
            }
        }
        __m128 scale = _mm_mul_ps(_mm_set1_ps(s[o]), _mm_loadu_ps(sx));
        float r[4];
        _mm_storeu_ps(r, _mm_mul_ps(_mm_cvtepi32_ps(hsum4x8(acc[0], acc[1], acc[2], acc[3])), scale));
        for (int i = 0; i < 4; i++) y[i * out + o] = r[i];
    }
}
#endif

#if !W8_SIMD
static void rows_portable(const int8_t *w, const float *s, int64_t kp, const int16_t *xq, float sx, float *y,
                          int64_t b0, int64_t b1) {
    for (int64_t o = 4 * b0; o < 4 * b1; o++) {
        const int8_t *wr = w + (o / 4) * 4 * kp + (o % 4) * 32;
        int32_t acc = 0;
        for (int64_t j = 0; j < kp; j += 32)
            for (int c = 0; c < 32; c++) acc += wr[4 * j + c] * xq[j + c];
        y[o] = (float)acc * (s[o] * sx);
    }
}
#endif

struct w8_args {
    const int8_t *w;
    const float *s, *sx;
    const int16_t *xq;
    int64_t out, kp, t;
    float *y;
};

static void w8_item(const void *ctx, int64_t b0, int64_t b1) {
    const struct w8_args *a = ctx;
    const int64_t kp = a->kp;
    int64_t i = 0;
#if W8_SIMD
    for (; i + 4 <= a->t; i += 4)
        rows_four_tokens(a->w, a->s, kp, a->xq + i * kp, a->sx + i, a->y + i * a->out, a->out, b0, b1);
    for (; i < a->t; i++) blocks_one_token(a->w, a->s, kp, a->xq + i * kp, a->sx[i], a->y + i * a->out, b0, b1);
#else
    for (; i < a->t; i++) rows_portable(a->w, a->s, kp, a->xq + i * kp, a->sx[i], a->y + i * a->out, b0, b1);
#endif
}

/* y [t, out] = float(codes xq [t, kp] . weight rows) * (w_scale[o] * sx[t]); out a multiple of 4 */
void w8_gemv_codes(const int8_t *w, const float *s, int64_t out, int64_t kp, const int16_t *xq, const float *sx,
                   int64_t t, float *y, int threads) {
    struct w8_args a = {w, s, sx, xq, out, kp, t, y};
    for_row_blocks(out, threads, w8_item, &a);
}
