/* The channel options' decode on AVX-512 (included by qr_channels.h on AVX-512 builds).
 * - ``+oN`` alone, INT4: a full row decoded in one pass, per 64 values every wire decoded and
 *   summed in registers and cast straight into the output, where qr_decode_merge otherwise writes
 *   a float32 row to L1 and reads it back for the cast.
 * - bf16 output of decoded sums (merge_row, coded): AVX512_BF16's conversion, one instruction for
 *   16 values where the integer rounding takes five.
 * - ``+h`` INT4 rows of several wires (the one-shot's local step at TP 2 and up): the wires decoded
 *   and summed in registers into the float32 row that the Hadamard then reads, without a float32
 *   row per wire in between.
 * - ``+h`` (block 64) INT4 rows of one wire (the two-shot's last step): the butterfly's spans 1-16
 *   on the integer codes in registers, per block of 64, then the cast (ch512_decode_h64_row_int4).
 * The same bytes as the float path (tests compare every build with the portable one and with the
 * torch path). A one-pass ``+h`` row with the butterfly in float32 registers measured slower than
 * the passes through L1 on Zen 4, whose vector units, not L1, bound these rows. */

/* The 64 values from c on of one INT4 wire row, decoded: (code - 8) * scale, as decode_row; with
 * plus0, + 0 as well (the merge's rule before its Hadamard, see fwht_blocks), in the same
 * instruction: a multiply-add of +0 to the exact product. */
static inline void ch512_decode64(const uint8_t *row, int64_t code_bytes, int c, __m512 *v, int plus0) {
    uint16_t scales[2]; /* copied: a wire may sit at any byte address */
    memcpy(scales, row + code_bytes + 2 * (c / BLK), sizeof scales);
    const __m512 s0 = _mm512_set1_ps(scale_value(scales[0])), s1 = _mm512_set1_ps(scale_value(scales[1]));
    const __m512 z = _mm512_setzero_ps();
    for (int i = 0; i < 4; i++) {
        const __m512 q = simd512_int4_codes16(row + c / 2 + 8 * i), s = i < 2 ? s0 : s1;
        v[i] = plus0 ? _mm512_fmadd_ps(q, s, z) : _mm512_mul_ps(q, s);
    }
}

/* The 64 values from c on of a row of nw INT4 wires (row offset off), decoded and added in wire
 * order in float32: decode_row's values and the accumulate loop's sums; with plus0, those sums
 * + 0 (the first wire's values + 0: a +0 start stays +0 through every later addition, and a sum
 * is -0 only when every term is). */
static inline void ch512_sum64(const uint8_t *const *wires, int nw, int64_t off, int64_t code_bytes, int c, __m512 *r,
                               int plus0) {
    __m512 v[4];
    ch512_decode64(wires[0] + off, code_bytes, c, r, plus0);
    for (int j = 1; j < nw; j++) {
        ch512_decode64(wires[j] + off, code_bytes, c, v, 0);
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
        ch512_sum64(wires, nw, off, code_bytes, c, r, 0);
        for (int i = 0; i < 4; i++) ch512_store16(r[i], out, out_type, start + c + 16 * i);
    }
    put_channels(start, ROW, hidden, chans, nch, osum, out, out_type);
}

/* The float32 sum, in wire order, of a full INT4 row of nw wires (row offset off) into acc: the
 * values decode_row + the accumulate loop give, without a float32 row per wire in between; with
 * plus0, + 0 (ch512_sum64). */
static void ch512_decode_sum_row_int4(const uint8_t *const *wires, int nw, int64_t off, int64_t code_bytes,
                                      float *acc, int plus0) {
    for (int c = 0; c < ROW; c += 64) {
        __m512 r[4];
        ch512_sum64(wires, nw, off, code_bytes, c, r, plus0);
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(acc + c + 16 * i, r[i]);
    }
}

/* ``+h`` (block 64) INT4 rows of one wire: the butterfly's first five stages on the integer codes.
 * One wire's decoded values are s * c, c = code - 8 in [-8, 7] and s its codec block's scale, each
 * zero made +0 by the merge's + 0 (fwht_blocks). The spans 1-16 stay inside a codec block of 32,
 * so every value they give is s * n with n the same stages' integer sum (|n| <= 256: nine bits),
 * and s * n is exact in float32 when s is a nonzero fp16 number (eleven significant bits): the
 * float butterfly's sums are exact there, equal to these integers times s, and a zero among them
 * is +0 (+0 + +0, +0 - +0 and x - x all give +0). Here the integers take s's sign and multiply
 * |s| * h (h the Hadamard's scale, a power of two: the product is exact and normal), so a zero is
 * +0 too. The span 32 meets two scales: it adds and subtracts the same two exact values in
 * float32; scaled by h before instead of after, which is the same rounding, since a power of two
 * scales every float32 between 2^-126 and the largest exactly (ch512_store16: these values are 0
 * or at least 2^-25 * h >= 2^-126). So the same bits as decode_row then merge_row. Blocks whose
 * scale is zero or not a finite fp16 number (extended, NaN) take that float path in registers.
 * Integer stages run 32 values a vector in int16 lanes, where float32 takes 16. */

/* One stage of span h on int16 lanes: a lane with the stage's bit clear gets v + p (a + c), one
 * with it set p - v (a - c); p is every lane's partner. */
static inline __m512i ch512_i16_stage(__m512i v, __m512i p, __mmask32 set) {
    return _mm512_mask_sub_epi16(_mm512_add_epi16(v, p), set, p, v);
}

/* The spans 2, 4, 8 and 16 of positions on a vector whose lane k holds position 2k (+1) of a block
 * of 64: lane bits 0-3. */
static inline __m512i ch512_i16_spans2to16(__m512i v) {
    v = ch512_i16_stage(v, _mm512_rol_epi32(v, 16), 0xAAAAAAAAu);              /* lane ^ 1 */
    v = ch512_i16_stage(v, _mm512_shuffle_epi32(v, 0xB1), 0xCCCCCCCCu);       /* lane ^ 2 */
    v = ch512_i16_stage(v, _mm512_shuffle_epi32(v, 0x4E), 0xF0F0F0F0u);       /* lane ^ 4 */
    return ch512_i16_stage(v, _mm512_shuffle_i64x2(v, v, 0xB1), 0xFF00FF00u); /* lane ^ 8 */
}

/* 16 int16 lanes as float32 times m. */
static inline __m512 ch512_i16_times(__m256i v, __m512 m) { return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(v)), m); }

/* The 64 transformed values of one block (32 code bytes at p; m0, m1: |s| * h of its two codec
 * blocks; neg0, neg1: all ones where that block's scale is negative, else 0) in position order
 * into r. */
static inline void ch512_int4_h64(const uint8_t *p, __m512 m0, __m512 m1, __mmask32 neg0, __mmask32 neg1, __m512 *r) {
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p)); /* word k: byte k */
    const __m512i lo = _mm512_and_si512(w, _mm512_set1_epi16(15)), hi = _mm512_srli_epi16(w, 4);
    /* span 1: positions 2k (low nibble) and 2k + 1; the biases (+8 each) cancel in the difference */
    __m512i sum = _mm512_sub_epi16(_mm512_add_epi16(lo, hi), _mm512_set1_epi16(16)), dif = _mm512_sub_epi16(lo, hi);
    sum = ch512_i16_spans2to16(sum), dif = ch512_i16_spans2to16(dif);
    /* positions 0-31 (the first codec block: lanes 0-15 of both, interleaved) and 32-63 (lanes 16-31) */
    const __m512i il = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                        5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i ih = _mm512_add_epi16(il, _mm512_set1_epi16(16)), z = _mm512_setzero_si512();
    __m512i a = _mm512_permutex2var_epi16(sum, il, dif), b = _mm512_permutex2var_epi16(sum, ih, dif);
    a = _mm512_mask_sub_epi16(a, neg0, z, a), b = _mm512_mask_sub_epi16(b, neg1, z, b); /* the scales' signs */
    const __m512 a0 = ch512_i16_times(_mm512_castsi512_si256(a), m0), a1 = ch512_i16_times(_mm512_extracti64x4_epi64(a, 1), m0);
    const __m512 b0 = ch512_i16_times(_mm512_castsi512_si256(b), m1), b1 = ch512_i16_times(_mm512_extracti64x4_epi64(b, 1), m1);
    r[0] = _mm512_add_ps(a0, b0), r[1] = _mm512_add_ps(a1, b1); /* span 32 */
    r[2] = _mm512_sub_ps(a0, b0), r[3] = _mm512_sub_ps(a1, b1);
}

/* One full ``+h`` (block 64) row of one INT4 wire into out: ch512_int4_h64 per block, the float path
 * for blocks with another scale, then the outlier sums over their channels (as
 * ch512_decode_merge_row_int4). h: the Hadamard's scale, a power of two in [2^-101, 1] (the
 * caller checks). bf16 output with AVX512_BF16 stores 32 values by one conversion: the integer
 * blocks' values are finite and never subnormal (above). */
static void ch512_decode_h64_row_int4(const uint8_t *row, int64_t code_bytes, float h, int64_t start, int64_t hidden,
                                      const int64_t *chans, int64_t nch, const float *osum, void *out, int out_type) {
    uint16_t hs[NBLK]; /* copied: a wire may sit at any byte address */
    float mag[NBLK];
    memcpy(hs, row + code_bytes, sizeof hs);
    uint64_t bad = 0, neg = 0;
    const __m512i ex = _mm512_set1_epi16(0x7C00), mg = _mm512_set1_epi16(0x7FFF), z = _mm512_setzero_si512();
    for (int q = 0; q < NBLK; q += 32) {
        const __m512i v = _mm512_loadu_si512(hs + q), a = _mm512_and_si512(v, mg);
        bad |= (uint64_t)(_mm512_cmpeq_epi16_mask(_mm512_and_si512(v, ex), ex) | _mm512_cmpeq_epi16_mask(a, z)) << q;
        neg |= (uint64_t)_mm512_movepi16_mask(v) << q;
        _mm512_storeu_ps(mag + q, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(a)), _mm512_set1_ps(h)));
        _mm512_storeu_ps(mag + q + 16, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(a, 1)), _mm512_set1_ps(h)));
    }
    const __m512 sv = _mm512_set1_ps(h);
    for (int c = 0; c < ROW; c += 64) {
        const int b = c / BLK;
        __m512 r[4];
        if (!((bad >> b) & 3u)) {
            ch512_int4_h64(row + c / 2, _mm512_set1_ps(mag[b]), _mm512_set1_ps(mag[b + 1]),
                           (__mmask32)(0u - (uint32_t)((neg >> b) & 1u)), (__mmask32)(0u - (uint32_t)((neg >> (b + 1)) & 1u)), r);
#ifdef __AVX512BF16__
            if (out_type == 1) {
                uint16_t *o = (uint16_t *)out + start + c;
                _mm512_storeu_si512(o, (__m512i)_mm512_cvtne2ps_pbh(r[1], r[0]));
                _mm512_storeu_si512(o + 32, (__m512i)_mm512_cvtne2ps_pbh(r[3], r[2]));
                continue;
            }
#endif
        } else {
            ch512_decode64(row, code_bytes, c, r, 1); /* with fwht_blocks' + 0 */
            fwht64_regs(r, sv);
        }
        for (int i = 0; i < 4; i++) ch512_store16(r[i], out, out_type, start + c + 16 * i);
    }
    put_channels(start, ROW, hidden, chans, nch, osum, out, out_type);
}
