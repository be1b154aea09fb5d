/* What the decode step's two attentions share (decode_ops.c over a float cache, kv_packed.c over
 * a packed one): 8-wide float32 helpers where the build has AVX2 and FMA (DECODE_SIMD), the
 * softmax's weights, and a store in the output's dtype. Include after the C headers and bf16.h. */
#ifndef LOWBIT_ATTENTION_COMMON_H
#define LOWBIT_ATTENTION_COMMON_H

static inline void store_at(void *y, int bf16, int64_t j, float v) {
    if (bf16)
        ((uint16_t *)y)[j] = f32_to_bf16(v);
    else
        ((float *)y)[j] = v;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DECODE_SIMD 1

static inline float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* e^x for x <= 0 (a softmax's shifted scores): 2^n * e^r with |r| <= ln2/2, e^r by its Taylor
 * polynomial to degree 7 (truncation < 2^-30 relative), so within a few float32 ulps of expf.
 * Below -87 the result is clamped to ~e^-87 (~1e-38), which no softmax sum can notice. */
static inline __m256 exp8_nonpos(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln2 = 0.693359375 - 2.12194440e-4 */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#else
#define DECODE_SIMD 0
#endif

/* A softmax's weights in place: scores[l] <- e^(scores[l] - max), the maximum subtracted first;
 * returns their sum, or NaN where the maximum is NaN or infinite (the head's output is then NaN,
 * as torch's softmax gives). */
static float softmax_weights(float *scores, int64_t L) {
    float m = -INFINITY;
    for (int64_t l = 0; l < L; l++)
        if (scores[l] > m || scores[l] != scores[l]) m = scores[l];
    if (!isfinite(m)) return NAN;
    int64_t l = 0;
#if DECODE_SIMD
    for (; l + 8 <= L; l += 8)
        _mm256_storeu_ps(scores + l, exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(scores + l), _mm256_set1_ps(m))));
#endif
    for (; l < L; l++) scores[l] = expf(scores[l] - m);
    float sum = 0.f;
    for (l = 0; l < L; l++) sum += scores[l];
    return sum;
}

#endif
