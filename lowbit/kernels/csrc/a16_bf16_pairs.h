/* The weight of the batched W4A16 / W8A16 kernel as bfloat16 channel pairs (included by the AMX-BF16
 * tiles, a16_amx_bf16.h, and the AVX512_BF16 dot products, a16_dpbf16.h, after a16_dequant.h): per
 * panel of 16 rows and pair of channels (c, c + 1) one 64-byte vector, row r's 32-bit lane holding
 * bf16(w[r, c]) low and bf16(w[r, c + 1]) high, w = (u - z) * s as a16_dequant.h computes it.
 * Defines A16_BF16_PAIRS where the build has AVX512_BF16. */
#ifndef LOWBIT_A16_BF16_PAIRS_H
#define LOWBIT_A16_BF16_PAIRS_H
#if PANEL_SIMD == 512 && defined(__AVX512BF16__)
#define A16_BF16_PAIRS 1
#include <immintrin.h>

/* 16 rows x 4 channels c..c+3 of codes (the INT8 panels' layout) -> the B tile rows of channel pairs
 * (c, c + 1) and (c + 2, c + 3): per row one 32-bit lane of two bfloat16. The float32 values are
 * a16_dequant.h's; VCVTNE2PS2BF16 rounds them to nearest even as torch does, except that it reads
 * a subnormal float32 as zero, which TDPBF16PS does with a subnormal bfloat16 anyway. */
static inline void bf16_pairs(uint8_t *tiles, int64_t c, __m512i codes, const __m512i zq[4], const __m512 sq[4]) {
    __m512 f[4]; /* rows 4j .. 4j + 3 x 4 channels */
    for (int j = 0; j < 4; j++)
        f[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(quarter_of(codes, j)), zq[j])), sq[j]);
    /* 32-bit lane 2 r + h of lo: row r (0-7), pair h; of hi: row 8 + r */
    const __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]), hi = (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2]);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    uint8_t *row = tiles + c / 2 * 64; /* pair c / 2 of the row: for AMX, tile step c / 32, its row c % 32 / 2 */
    _mm512_storeu_si512((void *)row, _mm512_permutex2var_epi32(lo, even, hi));
    _mm512_storeu_si512((void *)(row + 64), _mm512_permutex2var_epi32(lo, odd, hi));
}

/* Panel rows r0 .. r0 + 15, every channel of kp, as kp / 2 vectors [16 rows][channel pair] of bfloat16:
 * the B tiles of TDPBF16PS ([kp / 32][16 pairs][16 rows]) and the weight operand of VDPBF16PS alike. */
static void bf16_fill(uint8_t *tiles, const struct a16_weight *W, int64_t r0) {
    for (int64_t g = 0; g < W->ng; g++) {
        const int64_t a = g * W->group, b = a + W->group < W->kp ? a + W->group : W->kp, q = ((r0 / PANEL) * W->ng + g) * PANEL;
        __m512i zq[4];
        __m512 sq[4];
        dequant_spread(_mm512_loadu_si512((const void *)(W->zw + q)), _mm512_loadu_ps(W->sw + q), zq, sq);
        for (int64_t k = a; k < b; k += W->nibbles ? 8 : 4) { /* groups hold whole panel vectors (a16_gemm.py) */
            const __m512i raw = _mm512_loadu_si512((const void *)(W->w + panel_at(r0, k, W->kp, W->nibbles)));
            if (W->nibbles) {
                bf16_pairs(tiles, k, VMASK4(raw), zq, sq);
                bf16_pairs(tiles, k + 4, VSHR4(raw), zq, sq);
            } else {
                bf16_pairs(tiles, k, raw, zq, sq);
            }
        }
    }
}

#else
#define A16_BF16_PAIRS 0
#endif
#endif
