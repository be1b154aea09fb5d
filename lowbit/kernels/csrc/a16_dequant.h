/* The A16 panels' weight as bfloat16 rows (included by a16_gemm.c): w[r, k] = bf16((u - z) * s)
 * for row r's code u, zero point z and scale s of k's group, one float32 multiply rounded to
 * nearest even, exactly torch's ((codes - zero) * scale).to(bfloat16). For the many-token calls
 * that run on the CPU's own bfloat16 matmul (a16_gemm.py): the weight is unpacked once per call
 * instead of once per tile. The AVX-512 loop and the portable one give the same bits (tested). */
#ifndef LOWBIT_A16_DEQUANT_H
#define LOWBIT_A16_DEQUANT_H
#include "bf16.h"

struct dequant_job {
    const uint8_t *w;
    const float *sw;   /* [out_pad / 16, ng, 16] */
    const int32_t *zw; /* [out_pad / 16, ng, 16] */
    int64_t out, n, kp, group, ng;
    int nibbles;
    uint16_t *dst; /* [out, n] */
};

/* Where a panel's 16 rows are written first: rows n + 32 values apart, so that the 16 rows do not
 * share one set of the L1 cache as rows of a power-of-two width would (measured 4x slower on
 * 4096 columns), then copied out whole. Per thread, kept between calls. */
#define DQ_LD(n) ((n) + 32)
static __thread uint8_t *dq_buf;
static __thread int64_t dq_cap;

/* Rows r0 .. r0 + 15 (those below out) at channels [k0, k1) of group g, one value at a time, into
 * d (row i of the panel at d + i * ld). */
static void dequant_values(const struct dequant_job *J, uint16_t *d, int64_t ld, int64_t r0, int64_t g, int64_t k0,
                           int64_t k1) {
    for (int64_t r = r0; r < r0 + PANEL && r < J->out; r++) {
        const int64_t q = ((r / PANEL) * J->ng + g) * PANEL + r % PANEL;
        for (int64_t k = k0; k < k1; k++)
            d[(r - r0) * ld + k] =
                f32_to_bf16((float)((int32_t)panel_code(J->w, r, k, J->kp, J->nibbles) - J->zw[q]) * J->sw[q]);
    }
}

#if PANEL_SIMD == 512
/* The 16 rows' zero points and scales spread as dequant_quarter reads them: quarter j holds rows
 * 4j .. 4j + 3, each 4 times. */
static inline void dequant_spread(__m512i zv, __m512 sv, __m512i zq[4], __m512 sq[4]) {
    const __m512i base = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (int j = 0; j < 4; j++) {
        const __m512i idx = _mm512_add_epi32(base, _mm512_set1_epi32(4 * j));
        zq[j] = _mm512_permutexvar_epi32(idx, zv), sq[j] = _mm512_permutexvar_ps(idx, sv);
    }
}

/* 16 codes (rows 4j .. 4j + 3 of a panel x 4 channels, as the panels hold them) -> 16 bfloat16 in
 * the same order. */
static inline __m256i dequant_quarter(__m128i codes, __m512i zq, __m512 sq) {
    __m512i c = _mm512_sub_epi32(_mm512_cvtepu8_epi32(codes), zq);
    return f32_to_bf16_x16(_mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(c), sq)));
}

static inline __m128i quarter_of(__m512i v, int j) {
    return j == 0 ? _mm512_extracti32x4_epi32(v, 0)
           : j == 1 ? _mm512_extracti32x4_epi32(v, 1)
           : j == 2 ? _mm512_extracti32x4_epi32(v, 2)
                    : _mm512_extracti32x4_epi32(v, 3);
}

/* One 64-byte panel vector at channel k into rows 0-15 of d: INT8 codes (4 channels per row), or
 * 4-bit ones (8 channels per row: low nibbles 0-3, high 4-7, stored as one 16-byte run per row). */
static inline void dequant_vector(uint16_t *d, int64_t ld, __m512i raw, int nibbles, int64_t k, const __m512i zq[4],
                                  const __m512 sq[4]) {
    if (nibbles) {
        const __m512i lo = VMASK4(raw), hi = VSHR4(raw);
        for (int j = 0; j < 4; j++) {
            const __m256i vl = dequant_quarter(quarter_of(lo, j), zq[j], sq[j]);
            const __m256i vh = dequant_quarter(quarter_of(hi, j), zq[j], sq[j]);
            const __m256i a = _mm256_unpacklo_epi64(vl, vh), b = _mm256_unpackhi_epi64(vl, vh); /* rows 0, 2 | 1, 3 */
            uint16_t *r = d + 4 * j * ld + k;
            _mm_storeu_si128((__m128i *)r, _mm256_castsi256_si128(a));
            _mm_storeu_si128((__m128i *)(r + ld), _mm256_castsi256_si128(b));
            _mm_storeu_si128((__m128i *)(r + 2 * ld), _mm256_extracti128_si256(a, 1));
            _mm_storeu_si128((__m128i *)(r + 3 * ld), _mm256_extracti128_si256(b, 1));
        }
    } else {
        for (int j = 0; j < 4; j++) {
            const __m256i v = dequant_quarter(quarter_of(raw, j), zq[j], sq[j]);
            const __m128i v0 = _mm256_castsi256_si128(v), v1 = _mm256_extracti128_si256(v, 1);
            uint16_t *r = d + 4 * j * ld + k;
            _mm_storel_epi64((__m128i *)r, v0);
            _mm_storeh_pd((double *)(r + ld), _mm_castsi128_pd(v0));
            _mm_storel_epi64((__m128i *)(r + 2 * ld), v1);
            _mm_storeh_pd((double *)(r + 3 * ld), _mm_castsi128_pd(v1));
        }
    }
}
#endif

/* One panel of 16 rows, every group. */
static void dequant_item(const void *ctx, int64_t item) {
    const struct dequant_job *J = ctx;
    const int64_t r0 = item * PANEL, ld = DQ_LD(J->kp);
    uint16_t *const buf = (uint16_t *)grow_buffer(&dq_buf, &dq_cap, PANEL * ld * (int64_t)sizeof(uint16_t));
    uint16_t *d = buf ? buf : J->dst + r0 * J->n; /* no memory: straight into the rows */
    const int64_t dl = buf ? ld : J->n;
    const int rows = J->out - r0 < PANEL ? (int)(J->out - r0) : PANEL;
    for (int64_t g = 0; g < J->ng; g++) {
        const int64_t a = g * J->group, b = a + J->group < J->kp ? a + J->group : J->kp, e = b < J->n ? b : J->n;
        int64_t k = a;
#if PANEL_SIMD == 512
        const int64_t q = (item * J->ng + g) * PANEL, step = J->nibbles ? 8 : 4;
        __m512i zq[4];
        __m512 sq[4];
        dequant_spread(_mm512_loadu_si512((const void *)(J->zw + q)), _mm512_loadu_ps(J->sw + q), zq, sq);
        for (; k + step <= e && (buf || rows == PANEL); k += step)
            dequant_vector(d, dl, _mm512_loadu_si512((const void *)(J->w + panel_at(r0, k, J->kp, J->nibbles))),
                           J->nibbles, k, zq, sq);
#endif
        dequant_values(J, d, dl, r0, g, k, e);
    }
    if (buf)
        for (int i = 0; i < rows; i++) memcpy(J->dst + (r0 + i) * J->n, d + i * ld, (size_t)J->n * sizeof(uint16_t));
}
#endif
