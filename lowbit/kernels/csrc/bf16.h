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
