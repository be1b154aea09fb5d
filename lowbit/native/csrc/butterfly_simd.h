/* The Walsh-Hadamard butterfly's stages inside one vector (spans 1, 2, 4 and, in 512-bit vectors,
 * 8), shared by the kernels' online Hadamard (kernels/csrc/hadamard.c) and the all-reduce codecs'
 * block Hadamard (comm/codecs/csrc/qr_channels.h). Include after <immintrin.h>.
 *
 * A stage of span h: every lane's partner (lane ^ h) by a permute p; a lane whose bit h is clear
 * gets p + v (its pair's a + c), one whose bit is set p - v (a - c). Both as one multiply-add of v
 * by +1 or -1: the product is exact, so the one rounding is the scalar stage's a + c or a - c and
 * the bits are the same (IEEE addition commutes). Two instructions a stage where add, subtract
 * and blend take three or four. */
#ifndef LOWBIT_BUTTERFLY_SIMD_H
#define LOWBIT_BUTTERFLY_SIMD_H

#define BF_P1 0x3F800000 /* +1.0f */
#define BF_M1 0xBF800000 /* -1.0f */

#if defined(__AVX512F__)
static inline __m512 butterfly_in16(__m512 v) {
    const __m512 s1 = _mm512_castsi512_ps(_mm512_set_epi32(BF_M1, BF_P1, BF_M1, BF_P1, BF_M1, BF_P1, BF_M1, BF_P1,
                                                            BF_M1, BF_P1, BF_M1, BF_P1, BF_M1, BF_P1, BF_M1, BF_P1));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_set_epi32(BF_M1, BF_M1, BF_P1, BF_P1, BF_M1, BF_M1, BF_P1, BF_P1,
                                                            BF_M1, BF_M1, BF_P1, BF_P1, BF_M1, BF_M1, BF_P1, BF_P1));
    const __m512 s4 = _mm512_castsi512_ps(_mm512_set_epi32(BF_M1, BF_M1, BF_M1, BF_M1, BF_P1, BF_P1, BF_P1, BF_P1,
                                                            BF_M1, BF_M1, BF_M1, BF_M1, BF_P1, BF_P1, BF_P1, BF_P1));
    const __m512 s8 = _mm512_castsi512_ps(_mm512_set_epi32(BF_M1, BF_M1, BF_M1, BF_M1, BF_M1, BF_M1, BF_M1, BF_M1,
                                                            BF_P1, BF_P1, BF_P1, BF_P1, BF_P1, BF_P1, BF_P1, BF_P1));
    v = _mm512_fmadd_ps(v, s1, _mm512_permute_ps(v, 0xB1));          /* span 1: lanes 1 0 3 2 ... */
    v = _mm512_fmadd_ps(v, s2, _mm512_permute_ps(v, 0x4E));          /* span 2: lanes 2 3 0 1 ... */
    v = _mm512_fmadd_ps(v, s4, _mm512_shuffle_f32x4(v, v, 0xB1));    /* span 4: 128-bit lanes 1 0 3 2 */
    return _mm512_fmadd_ps(v, s8, _mm512_shuffle_f32x4(v, v, 0x4E)); /* span 8: 256-bit halves swapped */
}
#endif

#if defined(__AVX2__)
static inline __m256 butterfly_pm(__m256 v, __m256 s, __m256 p) { /* p + s * v, one rounding */
#if defined(__FMA__)
    return _mm256_fmadd_ps(v, s, p);
#else
    return _mm256_add_ps(_mm256_mul_ps(v, s), p);
#endif
}

static inline __m256 butterfly_in8(__m256 v) {
    const __m256 s1 = _mm256_castsi256_ps(_mm256_set_epi32(BF_M1, BF_P1, BF_M1, BF_P1, BF_M1, BF_P1, BF_M1, BF_P1));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_set_epi32(BF_M1, BF_M1, BF_P1, BF_P1, BF_M1, BF_M1, BF_P1, BF_P1));
    const __m256 s4 = _mm256_castsi256_ps(_mm256_set_epi32(BF_M1, BF_M1, BF_M1, BF_M1, BF_P1, BF_P1, BF_P1, BF_P1));
    v = butterfly_pm(v, s1, _mm256_permute_ps(v, 0xB1));              /* span 1: lanes 1 0 3 2 */
    v = butterfly_pm(v, s2, _mm256_permute_ps(v, 0x4E));              /* span 2: lanes 2 3 0 1 */
    return butterfly_pm(v, s4, _mm256_permute2f128_ps(v, v, 0x01));   /* span 4: halves swapped */
}
#endif

#endif
