/* The channel options' decode on AVX-512 (included by qr_channels.h on AVX-512 builds).
 * - ``+oN`` alone, INT4: a full row decoded in one pass, per 64 values every wire decoded and
 *   summed in registers and cast straight into the output, where qr_decode_merge otherwise writes
 *   a float32 row to L1 and reads it back for the cast.
 * - bf16 output of decoded sums (merge_row, coded): AVX512_BF16's conversion, one instruction for
 *   16 values where the integer rounding takes five.
 * - ``+h`` INT4 rows of several wires (TP 2 and up): the wires decoded and summed in registers into
 *   the float32 row that the Hadamard then reads, without a float32 row per wire in between.
 * The same operations in the same order, so the same bytes (tests compare every build with the
 * portable one and with the torch path). A one-pass ``+h`` row (butterfly in registers) measured
 * slower than the passes through L1 on Zen 4, whose vector units, not L1, bound these rows. */

/* The 64 values from c on of one INT4 wire row, decoded: (code - 8) * scale, as decode_row. */
static inline void ch512_decode64(const uint8_t *row, int64_t code_bytes, int c, __m512 *v) {
    uint16_t scales[2]; /* copied: a wire may sit at any byte address */
    memcpy(scales, row + code_bytes + 2 * (c / BLK), sizeof scales);
    __m512 s0 = _mm512_set1_ps(scale_value(scales[0])), s1 = _mm512_set1_ps(scale_value(scales[1]));
    v[0] = simd512_int4_decode16(row + c / 2, s0);
    v[1] = simd512_int4_decode16(row + c / 2 + 8, s0);
    v[2] = simd512_int4_decode16(row + c / 2 + 16, s1);
    v[3] = simd512_int4_decode16(row + c / 2 + 24, s1);
}

/* The 64 values from c on of a row of nw INT4 wires (row offset off), decoded and added in wire
 * order in float32: decode_row's values and the accumulate loop's sums. */
static inline void ch512_sum64(const uint8_t *const *wires, int nw, int64_t off, int64_t code_bytes, int c, __m512 *r) {
    __m512 v[4];
    ch512_decode64(wires[0] + off, code_bytes, c, r);
    for (int j = 1; j < nw; j++) {
        ch512_decode64(wires[j] + off, code_bytes, c, v);
        for (int i = 0; i < 4; i++) r[i] = _mm512_add_ps(r[i], v[i]);
    }
}

/* 16 decoded values into out + i as out_type (0 float32, 1 bf16, 2 f16 saturated as cast_one).
 * bf16 as to_bf16 (round to nearest even, NaN -> 0xFFFF); with AVX512_BF16 by its conversion,
 * which flushes subnormal inputs to zero, but none comes here: a decoded value is a multiple of
 * 2^-25 (codes, INT or E2M1, times fp16 or extended scales), and so are the float32 sums and
 * butterfly stages of such values (below 2^-1 they are exact, above it float32's spacing is a
 * multiple of 2^-25), so each is 0 or at least 2^-25 in magnitude; ChannelPlan's block Hadamard
 * scale 1/sqrt(B) >= 1/8 keeps it at least 2^-28, far from float32's subnormals (< 2^-126), and
 * merge_row takes this path only for a scale that keeps 2^-25 normal (the C entry takes any). */
static inline void ch512_store16(__m512 v, void *out, int out_type, int64_t i) {
    if (out_type == 0) {
        _mm512_storeu_ps((float *)out + i, v);
    } else if (out_type == 1) {
#ifdef __AVX512BF16__
        __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
        b = _mm256_mask_mov_epi16(b, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm256_set1_epi16(-1));
        _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), b);
#else
        _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), simd512_bf16_bits(v));
#endif
    } else {
        __m512 a = _mm512_abs_ps(v);
        __mmask16 sat = _mm512_cmp_ps_mask(a, _mm512_set1_ps(F16_MAX), _CMP_GT_OQ)
                        & _mm512_cmp_ps_mask(a, _mm512_set1_ps(65536.0f), _CMP_LT_OQ);
        __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u)); /* no DQ */
        __m512 lim = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(F16_MAX)), sign));
        v = _mm512_mask_mov_ps(v, sat, lim);
        _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
}

/* One full row of the one-shot's local step from nw INT4 wires (row offset off), no Hadamard:
 * per 64 values every wire decoded and added in wire order, then cast into out; then the outlier
 * sums written over their channels with the same cast (merge_row puts them in before its cast:
 * the same bits). */
static void ch512_decode_merge_row_int4(const uint8_t *const *wires, int nw, int64_t off, int64_t code_bytes,
                                        int64_t start, int64_t hidden, const int64_t *chans, int64_t nch,
                                        const float *osum, void *out, int out_type) {
    for (int c = 0; c < ROW; c += 64) {
        __m512 r[4];
        ch512_sum64(wires, nw, off, code_bytes, c, r);
        for (int i = 0; i < 4; i++) ch512_store16(r[i], out, out_type, start + c + 16 * i);
    }
    put_channels(start, ROW, hidden, chans, nch, osum, out, out_type);
}

/* The float32 sum, in wire order, of a full INT4 row of nw wires (row offset off) into acc: the
 * values decode_row + the accumulate loop give, without a float32 row per wire in between. */
static void ch512_decode_sum_row_int4(const uint8_t *const *wires, int nw, int64_t off, int64_t code_bytes,
                                      float *acc) {
    for (int c = 0; c < ROW; c += 64) {
        __m512 r[4];
        ch512_sum64(wires, nw, off, code_bytes, c, r);
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(acc + c + 16 * i, r[i]);
    }
}
