/* bfloat16 <-> float32 as torch converts them, and reading one value (or, with AVX2, 8 values as
 * float32) of a float32 or bfloat16 row. */
#ifndef LOWBIT_BF16_H
#define LOWBIT_BF16_H
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch's .to(bfloat16) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__AVX512F__)
/* 16 float32 bit patterns -> 16 bfloat16 as f32_to_bf16 (round to nearest even, NaN quieted). */
static inline __m256i f32_to_bf16_x16(__m512i u) {
    __m512i rne = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                         _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    rne = _mm512_mask_mov_epi32(rne, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(rne);
}
#endif

/* n float32 values -> bfloat16 as f32_to_bf16, 16 (AVX-512) or 8 (AVX2) at a time: an output pass
 * that costs less than the products before it. */
static inline void f32_to_bf16_row(uint16_t *d, const float *s, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16)
        _mm256_storeu_si256((__m256i *)(d + j), f32_to_bf16_x16(_mm512_castps_si512(_mm512_loadu_ps(s + j))));
#elif defined(__AVX2__)
    for (; j + 8 <= n; j += 8) {
        __m256i u = _mm256_castps_si256(_mm256_loadu_ps(s + j));
        __m256i rne = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                             _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))), 16);
        /* |u| > inf as signed compare: both sides are below 2^31 */
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
        rne = _mm256_blendv_epi8(rne, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
        __m128i lo = _mm256_castsi256_si128(rne), hi = _mm256_extracti128_si256(rne, 1);
        _mm_storeu_si128((__m128i *)(d + j), _mm_packus_epi32(lo, hi)); /* every lane is <= 0xffff */
    }
#endif
    for (; j < n; j++) d[j] = f32_to_bf16(s[j]);
}

static inline float act_at(const void *x, int bf16, int64_t j) {
    return bf16 ? bf16_to_f32(((const uint16_t *)x)[j]) : ((const float *)x)[j];
}

#if defined(__AVX2__)
static inline __m256 act_load8(const void *x, int bf16, int64_t j) {
    if (bf16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + j))), 16));
    return _mm256_loadu_ps((const float *)x + j);
}
#endif

#endif
