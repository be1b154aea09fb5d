/* Shared by the native A16 kernels (W4A16, W8A16): bfloat16 <-> float32, the rounding of
 * activations to int16 codes per group (scale = absmax / 32767, round half to even), read straight
 * from the caller's float32 or bfloat16 rows, and the driver of one whole linear (a16_linear).
 *
 * The includer defines ACT_SIMD (1: AVX2). The AVX2 and the portable loops give the same bits:
 * the same IEEE divide and round-to-nearest-even per value, an exact max and exact integer sums.
 */
#ifndef LOWBIT_ACT_INT16_H
#define LOWBIT_ACT_INT16_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if ACT_SIMD
#include <immintrin.h>
#endif
#include "bf16.h"

/* Values [a, b) of x: their absmax, and whether all are finite. */
static inline float act_absmax(const void *x, int bf16, int64_t a, int64_t b, int *finite) {
    float amax = 0.f;
    int ok = 1;
    int64_t j = a;
#if ACT_SIMD
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (; j + 8 <= b; j += 8) {
        __m256 v = _mm256_and_ps(act_load8(x, bf16, j), absmask);
        m = _mm256_max_ps(m, v);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ)); /* Inf or NaN */
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    amax = _mm_cvtss_f32(h);
    ok = _mm256_movemask_ps(bad) == 0;
#endif
    for (; j < b; j++) {
        float v = act_at(x, bf16, j);
        amax = fmaxf(amax, fabsf(v));
        ok &= isfinite(v) != 0;
    }
    *finite = ok;
    return amax;
}

/* Codes of values [a, b) with step s (finite): q = round_half_even(x / s) in [-32767, 32767];
 * returns their sum. */
static inline int32_t act_codes(const void *x, int bf16, int64_t a, int64_t b, float s, int16_t *q) {
    int32_t sum = 0;
    int64_t j = a;
#if ACT_SIMD
    const __m256 sv = _mm256_set1_ps(s), hi = _mm256_set1_ps(32767.f), lo = _mm256_set1_ps(-32767.f);
    __m256i acc = _mm256_setzero_si256();
    for (; j + 8 <= b; j += 8) {
        __m256 r = _mm256_round_ps(_mm256_div_ps(act_load8(x, bf16, j), sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i c = _mm256_cvttps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
        acc = _mm256_add_epi32(acc, c);
        _mm_storeu_si128((__m128i *)(q + j - a),
                         _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1)));
    }
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    h = _mm_hadd_epi32(h, h);
    h = _mm_hadd_epi32(h, h);
    sum = _mm_cvtsi128_si32(h);
#endif
    for (; j < b; j++) {
        int32_t c = (int32_t)nearbyintf(act_at(x, bf16, j) / s);
        c = c > 32767 ? 32767 : (c < -32767 ? -32767 : c);
        q[j - a] = (int16_t)c;
        sum += c;
    }
    return sum;
}

/* Token rows x [t, k] (float32, or bfloat16 when bf16) -> xq [t, kp] int16 (zero padded), sx
 * [t, ng] the groups' steps (absmax / 32767; 1 for an all-zero group) and, when xsum is not NULL,
 * xsum [t, ng] the exact sums of each group's codes. A group with NaN/Inf gets a NaN step (so the
 * token's outputs are NaN) and zero codes. */
static void quant_act(const void *x, int bf16, int64_t t, int64_t k, int64_t kp, int64_t group, int64_t ng,
                      int16_t *xq, float *sx, int32_t *xsum) {
    for (int64_t i = 0; i < t; i++) {
        int16_t *qr = xq + i * kp;
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * group, b = a + group < k ? a + group : k;
            int finite = 1;
            float amax = a < b ? act_absmax(x, bf16, i * k + a, i * k + b, &finite) : 0.f;
            float s = !finite ? NAN : amax > 0.f ? amax / 32767.f : 1.f;
            if (s == 0.f) s = 0x1p-149f; /* amax < 2^-135: the smallest step still covers it */
            int32_t sum = 0;
            if (finite)
                sum = a < b ? act_codes(x, bf16, i * k + a, i * k + b, s, qr + a) : 0;
            else if (a < b)
                memset(qr + a, 0, (size_t)(b - a) * sizeof(int16_t));
            sx[i * ng + g] = s;
            if (xsum) xsum[i * ng + g] = sum;
        }
        for (int64_t j = k; j < kp; j++) qr[j] = 0;
    }
}

/* The weight half of an A16 linear: int16 codes xq [t, kp], their steps sx [t, ng] and (when the
 * linear asked for them) code sums xsum [t, ng] -> y [t, out] float32. */
typedef void (*a16_gemv_fn)(const void *weight, const int16_t *xq, const float *sx, const int32_t *xsum, int64_t t,
                            float *y, int threads);

/* One A16 linear, one crossing from Python: x [t, k] float32 (x_bf16 = 0) or bfloat16 (1) is
 * rounded to int16 codes in groups of `group` (ng of them over kp padded channels), `gemv` runs,
 * and y [t, out] is written as float32 or bfloat16 (y_bf16). Returns 0, or -1 if out of memory. */
static int a16_linear(a16_gemv_fn gemv, const void *weight, int64_t out, int64_t k, int64_t kp, int64_t group,
                      int64_t ng, int sums, const void *x, int x_bf16, int64_t t, void *y, int y_bf16, int threads) {
    if (t <= 0) return 0;
    int16_t *xq = malloc((size_t)(t * kp) * sizeof(int16_t));
    float *sx = malloc((size_t)(t * ng) * sizeof(float));
    int32_t *xsum = sums ? malloc((size_t)(t * ng) * sizeof(int32_t)) : NULL;
    float *yf = y_bf16 ? malloc((size_t)(t * out) * sizeof(float)) : (float *)y;
    int rc = -1;
    if (!xq || !sx || (sums && !xsum) || !yf) goto done;
    quant_act(x, x_bf16, t, k, kp, group, ng, xq, sx, xsum);
    gemv(weight, xq, sx, xsum, t, yf, threads);
    if (y_bf16) f32_to_bf16_row((uint16_t *)y, yf, t * out);
    rc = 0;
done:
    free(xq), free(sx), free(xsum);
    if (y_bf16) free(yf);
    return rc;
}
#endif
