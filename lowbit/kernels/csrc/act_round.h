/* The per-value steps both activation quantizers share (act_int16.h: int16 codes for the A16
 * kernels; act_sym.h: INT8/INT4 codes for W8A8/W4A4): a block's absmax and finiteness, the first
 * index holding a magnitude, and codes round_half_even(x / s) clamped to a range with their sum.
 * The includer defines ACT_SIMD (1: an AVX2 build); the AVX2 and the portable loops give the same
 * bits: the same IEEE divide and round-to-nearest-even per value, an exact max, exact integer sums.
 */
#ifndef LOWBIT_ACT_ROUND_H
#define LOWBIT_ACT_ROUND_H
#include <math.h>
#include <stdint.h>
#include "bf16.h"
#if defined(ACT_SIMD) && ACT_SIMD && defined(__AVX2__)
#include <immintrin.h>
#define ACT_ROUND_SIMD 1
#else
#define ACT_ROUND_SIMD 0
#endif

/* Values [a, b) of x: their absmax, and whether all are finite. */
static inline float act_absmax(const void *x, int bf16, int64_t a, int64_t b, int *finite) {
    float amax = 0.f;
    int ok = 1;
    int64_t j = a;
#if ACT_ROUND_SIMD
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    /* two independent max and flag chains: one chain waits a max's latency per vector (about half
     * the pass on 576-value rows); the max is exact, so the order does not change it */
    __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps(), m1 = m, bad1 = bad;
    for (; j + 16 <= b; j += 16) {
        __m256 v = _mm256_and_ps(act_load8(x, bf16, j), absmask), v1 = _mm256_and_ps(act_load8(x, bf16, j + 8), absmask);
        m = _mm256_max_ps(m, v), m1 = _mm256_max_ps(m1, v1);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ)); /* Inf or NaN */
        bad1 = _mm256_or_ps(bad1, _mm256_cmp_ps(v1, inf, _CMP_NLT_UQ));
    }
    for (; j + 8 <= b; j += 8) {
        __m256 v = _mm256_and_ps(act_load8(x, bf16, j), absmask);
        m = _mm256_max_ps(m, v);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ));
    }
    m = _mm256_max_ps(m, m1), bad = _mm256_or_ps(bad, bad1);
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

/* Codes of values [a, b) with step s (finite, nonzero): q = round_half_even(x / s) clamped to
 * [lo, hi] (integers within int16); returns their exact sum. */
static inline int32_t act_round_codes(const void *x, int bf16, int64_t a, int64_t b, float s, float lo, float hi,
                                      int16_t *q) {
    int32_t sum = 0;
    int64_t j = a;
#if ACT_ROUND_SIMD
    const __m256 sv = _mm256_set1_ps(s), hv = _mm256_set1_ps(hi), lv = _mm256_set1_ps(lo);
    __m256i acc = _mm256_setzero_si256();
    for (; j + 8 <= b; j += 8) {
        __m256 r = _mm256_round_ps(_mm256_div_ps(act_load8(x, bf16, j), sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i c = _mm256_cvttps_epi32(_mm256_max_ps(_mm256_min_ps(r, hv), lv));
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
        float c = nearbyintf(act_at(x, bf16, j) / s);
        c = c < lo ? lo : (c > hi ? hi : c); /* in float: x / s may overflow int32 */
        q[j - a] = (int16_t)c;
        sum += (int32_t)c;
    }
    return sum;
}

/* The first index of [a, b) whose magnitude equals m (a if none: an empty block). */
static inline int64_t act_first_magnitude(const void *x, int bf16, int64_t a, int64_t b, float m) {
    int64_t j = a;
#if ACT_ROUND_SIMD
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), mv = _mm256_set1_ps(m);
    for (; j + 8 <= b; j += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(act_load8(x, bf16, j), absmask), mv, _CMP_EQ_OQ));
        if (hit) return j + __builtin_ctz((unsigned)hit);
    }
#endif
    for (; j < b; j++)
        if (fabsf(act_at(x, bf16, j)) == m) return j;
    return a;
}

#endif
