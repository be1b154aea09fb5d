/* Fused CPU encoder/decoder of the all-reduce wire formats (see ../spec.py, ../reference.py).
 * One pass per 2048-value row: block scales, codes and bit planes without temporaries.
 * Bit-exact to the torch implementations: IEEE fp32 divide, rint (round half to even),
 * fp16 scales via _Float16 (round to nearest even), integer scales rounded away from zero
 * when fp16 rounding shrank them. Build: cc -O3 -march=native -shared -fPIC (no -ffast-math);
 * with AVX2 + F16C the row steps use the intrinsics of qr_avx2.h (same operations, same bits),
 * -DQR_NO_SIMD or another CPU gives the portable loops below. Full rows of bf16 input (encode)
 * and bf16 output (decode) take fused SIMD paths that never widen the row to fp32 in memory.
 * qr_reduce fuses the all-reduce's decode + sum + re-encode per row. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ROW 2048
#define BLK 32
#define NBLK (ROW / BLK)
#define HALF_NAN 0x7E00u
#define HALF_ONE 0x3C00u

#define BF16_MAX 3.3895313892515355e38f /* decoded values stay within bfloat16 (extended scales) */
#define F16_MAX 65504.0f

#include "../../../native/csrc/half.h"

/* Extended scales (see ../extscale.py): fp16 NaN bit patterns with bit 9 clear and a payload p
 * with 1 <= p/4 <= 112 carry +-2^(15 + p/4) * (1 + (p & 3)/4), for finite blocks beyond the fp16
 * range. Other bits with the exponent all ones (fp16 +-inf, NaN, payloads no encoder writes) are
 * NaN: a peer's corrupt scale poisons its block, the same in every build and in torch. */
static inline int is_ext(uint16_t h) {
    return (h & 0x7E00u) == 0x7C00u && ((h & 0x1FFu) >> 2) >= 1u && ((h & 0x1FFu) >> 2) <= 112u;
}

static inline float scale_value(uint16_t h) {
    if ((h & 0x7C00u) != 0x7C00u) return (float)h_from(h);
    if (!is_ext(h)) return NAN;
    uint32_t p = h & 0x1FFu, mag = (((p >> 2) + 142u) << 23) | ((p & 3u) << 21);
    float v;
    memcpy(&v, &mag, 4);
    return (h & 0x8000u) ? -v : v;
}

/* The extended scale for the finite float32 scale s32: the smallest 2-significant-bit value
 * >= |s32|, with s32's sign; its value into *s. */
static inline uint16_t ext_scale(float s32, float *s) {
    uint32_t b;
    memcpy(&b, &s32, 4);
    uint32_t mag = ((b & 0x7FFFFFFFu) + 0x1FFFFFu) & 0x7FE00000u;
    float v;
    memcpy(&v, &mag, 4);
    *s = (b >> 31) ? -v : v;
    return (uint16_t)(((b >> 31) << 15) | 0x7C00u | (((mag >> 23) - 142u) << 2) | ((mag >> 21) & 3u));
}

/* 1: the AVX-512 integer codes divide instead of multiplying by the reciprocal (qr_avx512.h); the
 * same bits, set once after loading (the codecs run no threads). */
static int qr_divide_codes = 0;

void qr_set_divide_codes(int on) { qr_divide_codes = on != 0; }

#if defined(__AVX2__) && defined(__F16C__) && !defined(QR_NO_SIMD)
#include "qr_avx2.h"
#endif

static void load_row(const void *in, int in_type, int64_t start, int64_t n, float *buf) {
    int64_t avail = n - start;
    int64_t m = avail < ROW ? (avail > 0 ? avail : 0) : ROW;
    if (in_type == 0) {
        const float *p = (const float *)in + start;
        for (int64_t i = 0; i < m; i++) buf[i] = p[i];
    } else if (in_type == 1) {
        const uint16_t *p = (const uint16_t *)in + start;
        for (int64_t i = 0; i < m; i++) {
            uint32_t b = ((uint32_t)p[i]) << 16;
            memcpy(&buf[i], &b, 4);
        }
    } else {
        const _Float16 *p = (const _Float16 *)in + start;
        for (int64_t i = 0; i < m; i++) buf[i] = (float)p[i];
    }
    for (int64_t i = m; i < ROW; i++) buf[i] = 0.0f;
}

__attribute__((unused)) static inline void pack_plane_c(const uint8_t *codes, int shift, int w, uint8_t *out) {
    const int per = 8 / w;
    const uint8_t mask = (uint8_t)((1u << w) - 1u);
    for (int i = 0; i < ROW / per; i++) {
        uint8_t byte = 0;
        for (int j = 0; j < per; j++) byte |= (uint8_t)(((codes[i * per + j] >> shift) & mask) << (j * w));
        out[i] = byte;
    }
}

__attribute__((unused)) static inline void unpack_plane_c(const uint8_t *in, int shift, int w, uint8_t *codes) {
    const int per = 8 / w;
    const uint8_t mask = (uint8_t)((1u << w) - 1u);
    for (int i = 0; i < ROW / per; i++)
        for (int j = 0; j < per; j++) codes[i * per + j] |= (uint8_t)(((in[i] >> (j * w)) & mask) << shift);
}

#ifdef QR_SIMD
#define pack_plane(codes, shift, w, out) simd_pack_plane(codes, shift, w, out)
#define unpack_plane(in, shift, w, codes) simd_unpack_plane(in, shift, w, codes, shift == 0)
#else
#define pack_plane pack_plane_c
#define unpack_plane unpack_plane_c
#endif

/* Planes of 4, 2, 1 bits, low bits first, one after another (8 bits: the bytes themselves). */
static void pack_planes(const uint8_t *codes, int bits, uint8_t *out) {
    switch (bits) {
    case 8: memcpy(out, codes, ROW); break;
    case 6: pack_plane(codes, 0, 4, out); pack_plane(codes, 4, 2, out + ROW / 2); break;
    case 4: pack_plane(codes, 0, 4, out); break;
    case 3: pack_plane(codes, 0, 2, out); pack_plane(codes, 2, 1, out + ROW / 4); break;
    }
}

static void unpack_planes(const uint8_t *in, int bits, uint8_t *codes) {
    if (bits == 8) { memcpy(codes, in, ROW); return; }
#ifndef QR_SIMD
    memset(codes, 0, ROW); /* the SIMD planes overwrite on the first (shift 0) plane */
#endif
    switch (bits) {
    case 6: unpack_plane(in, 0, 4, codes); unpack_plane(in + ROW / 2, 4, 2, codes); break;
    case 4: unpack_plane(in, 0, 4, codes); break;
    case 3: unpack_plane(in, 0, 2, codes); unpack_plane(in + ROW / 4, 2, 1, codes); break;
    }
}

static inline uint16_t to_bf16(float f) { /* round to nearest even; NaN -> 0xFFFF as torch on CPU */
    if (f != f) return 0xFFFFu;
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

static inline int e2m1_index(float a) {
    return (a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) + (a > 5.0f)
           + (a == 0.75f) + (a == 1.75f) + (a == 3.5f);
}

/* A finite block whose scale s32 (signed absmax / qmin, or absmax / 6) is beyond fp16: the
 * extended scale, and codes capped so that no decoded value passes BF16_MAX. Rare: plain code. */
static void encode_block_ext(int kind, int qmin, int qmax, int bias, const float *x, float s32, uint8_t *c,
                             uint16_t *scale) {
    float s;
    *scale = ext_scale(s32, &s);
    float cap = BF16_MAX / fabsf(s);
    if (kind == 0) {
        float hi = fminf((float)qmax, floorf(cap)), lo = fmaxf((float)qmin, -floorf(cap));
        for (int j = 0; j < BLK; j++) {
            float q = rintf(x[j] / s);
            q = q < lo ? lo : (q > hi ? hi : q);
            c[j] = (uint8_t)((int)q + bias);
        }
    } else {
        float g = cap >= 6.0f ? 6.0f : 4.0f; /* cap >= 4.8 always (see extscale.fp4_cap) */
        for (int j = 0; j < BLK; j++) {
            float v = x[j] / s;
            v = v < -g ? -g : (v > g ? g : v);
            c[j] = (uint8_t)(e2m1_index(fabsf(v)) | ((v < 0.0f) << 3));
        }
    }
}

/* Portable per-block encoder: scale (fp16 bits into *scale) and codes of one 32-value block. */
__attribute__((unused)) static void encode_block_scalar(int kind, int qmin, int qmax, int bias, const float *x, uint8_t *c, uint16_t *scale) {
    /* |x| as integer bits: order-preserving for non-negative floats, so the max
     * vectorises; NaN/Inf are exactly the bits >= 0x7F800000. */
    uint32_t mb = 0;
    const uint32_t *xb = (const uint32_t *)x;
    for (int j = 0; j < BLK; j++) {
        uint32_t a = xb[j] & 0x7FFFFFFFu;
        mb = a > mb ? a : mb;
    }
    int finite = mb < 0x7F800000u, bi = BLK - 1;
    for (int j = 0; j < BLK; j++) { /* first index of the max, like argmax (vectorised min) */
        int cand = (xb[j] & 0x7FFFFFFFu) == mb ? j : BLK - 1;
        bi = cand < bi ? cand : bi;
    }
    float best = fabsf(x[bi]);
    _Float16 h = 0;
    int bad = !finite;
    if (!bad) {
        float s32 = kind == 0 ? x[bi] / (float)qmin : best / 6.0f;
        h = (_Float16)s32;
        if (kind == 0 && fabsf((float)h) < fabsf(s32)) h = h_from((uint16_t)(h_bits(h) + 1u)); /* away from 0 */
        if (isinf((float)h)) {
            encode_block_ext(kind, qmin, qmax, bias, x, s32, c, scale);
            return;
        }
    }
    if (bad) {
        memset(c, 0, BLK);
        *scale = HALF_NAN;
        return;
    }
    uint16_t hb = h_bits(h);
    if ((hb & 0x7FFFu) == 0) { hb = HALF_ONE; h = h_from(hb); }
    *scale = hb;
    float s = (float)h;
    if (kind == 0) {
        for (int j = 0; j < BLK; j++) { /* finite here: an integer clamp vectorises */
            int q = (int)rintf(x[j] / s);
            q = q < qmin ? qmin : q;
            q = q > qmax ? qmax : q;
            c[j] = (uint8_t)(q + bias);
        }
    } else {
        for (int j = 0; j < BLK; j++) {
            float v = x[j] / s;
            c[j] = (uint8_t)(e2m1_index(fabsf(v)) | ((v < 0.0f) << 3));
        }
    }
}

/* One row of 2048 floats -> its wire bytes (any kind; FP kinds round to their wire dtype). */
static void encode_row(const float *buf, int kind, int bits, uint8_t *orow, int64_t code_bytes) {
    uint8_t codes[ROW];
    const int qmin = -(1 << (bits - 1)), qmax = (1 << (bits - 1)) - 1, bias = 1 << (bits - 1);
    if (kind == 4) { memcpy(orow, buf, ROW * sizeof(float)); return; }
    if (kind >= 2) {
        uint16_t *o = (uint16_t *)orow;
        if (kind == 2)
            for (int i = 0; i < ROW; i++) o[i] = to_bf16(buf[i]);
        else
            for (int i = 0; i < ROW; i++) { _Float16 h = (_Float16)buf[i]; memcpy(&o[i], &h, 2); }
        return;
    }
    uint16_t *scales = (uint16_t *)(orow + code_bytes);
#ifdef QR_SIMD
    float amax[NBLK], s[NBLK];
    int32_t mbits[NBLK];
    int16_t bad[NBLK];
    simd_row_absmax(buf, amax, mbits);
    simd_row_scales(kind, qmin, amax, mbits, scales, s, bad);
#ifdef QR_SIMD512
    if (kind == 0 && bits == 4) { /* the nibbles straight into the row; a rare bad block via its codes */
        for (int b = 0; b < NBLK; b++) {
            if (!bad[b]) {
                simd512_int4_nibbles(_mm512_loadu_ps(buf + b * BLK), _mm512_loadu_ps(buf + b * BLK + 16), s[b],
                                     orow + b * BLK / 2);
                continue;
            }
            uint8_t *c = codes + b * BLK;
            if (mbits[b] < 0x7F800000)
                encode_block_ext(kind, qmin, qmax, bias, buf + b * BLK, amax[b] / (float)qmin, c, scales + b);
            else
                memset(c, 0, BLK);
            for (int j = 0; j < BLK / 2; j++) orow[b * BLK / 2 + j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
        }
        return;
    }
#endif
    for (int b = 0; b < NBLK; b++) {
        if (!bad[b])
            simd_block_codes(kind, qmin, qmax, bias, buf + b * BLK, s[b], codes + b * BLK);
        else if (mbits[b] < 0x7F800000) /* finite, scale beyond fp16 */
            encode_block_ext(kind, qmin, qmax, bias, buf + b * BLK,
                             kind == 0 ? amax[b] / (float)qmin : fabsf(amax[b]) / 6.0f, codes + b * BLK, scales + b);
        else
            memset(codes + b * BLK, 0, BLK);
    }
#else
    for (int b = 0; b < NBLK; b++) encode_block_scalar(kind, qmin, qmax, bias, buf + b * BLK, codes + b * BLK, scales + b);
#endif
    pack_planes(codes, kind == 0 ? bits : 4, orow);
}

/* 1 when (kind, bits, row_bytes, code_bytes) is a wire layout this file writes and reads. */
static int layout_ok(int kind, int bits, int64_t row_bytes, int64_t code_bytes) {
    if (kind == 0 && (bits == 3 || bits == 4 || bits == 6 || bits == 8))
        return code_bytes == ROW * bits / 8 && row_bytes == code_bytes + NBLK * 2;
    if (kind == 1) return bits == 4 && code_bytes == ROW / 2 && row_bytes == code_bytes + NBLK * 2;
    if (kind == 2 || kind == 3) return code_bytes == 2 * ROW && row_bytes == code_bytes;
    if (kind == 4) return code_bytes == 4 * ROW && row_bytes == code_bytes;
    return 0;
}

/* rows * row_bytes <= bytes, without overflow (rows, row_bytes >= 0). */
static int fits(int64_t rows, int64_t row_bytes, int64_t bytes) {
    return rows >= 0 && bytes >= 0 && (rows == 0 || row_bytes <= bytes / rows);
}

/* kind 0: symmetric integer (bits 3, 4, 6, 8), kind 1: FP4 E2M1, 2/3/4: FP with a bf16/fp16/fp32 wire.
 * in_type 0 f32, 1 bf16, 2 f16. out_bytes: the size of out. Returns 0, or -1 (nothing touched) when
 * the arguments do not describe buffers this call can fill: the Python wrapper checks first. */
int qr_encode(const void *in, int in_type, int64_t n, int64_t rows, int kind, int bits,
              uint8_t *out, int64_t row_bytes, int64_t code_bytes, int64_t out_bytes) {
    float buf[ROW];
    if (!layout_ok(kind, bits, row_bytes, code_bytes) || in_type < 0 || in_type > 2 || n < 0
        || !fits(rows, row_bytes, out_bytes))
        return -1;
    if (kind == 4) { /* FP codec, fp32 wire: the raw fp32 values (16-bit input widens exactly) */
        for (int64_t r = 0; r < rows; r++) {
            float *o = (float *)(out + r * row_bytes);
            if (in_type == 0) {
                int64_t avail = n - r * ROW, m = avail < ROW ? (avail > 0 ? avail : 0) : ROW;
                memcpy(o, (const float *)in + r * ROW, (size_t)m * 4);
                memset(o + m, 0, (size_t)(ROW - m) * 4);
            } else {
                load_row(in, in_type, r * ROW, n, buf);
                memcpy(o, buf, sizeof buf);
            }
        }
        return 0;
    }
    if (kind >= 2) { /* FP codec: the raw 16-bit values (kind 2: bf16 wire, kind 3: fp16 wire) */
        for (int64_t r = 0; r < rows; r++) {
            uint16_t *o = (uint16_t *)(out + r * row_bytes);
            if (in_type == kind - 1) { /* same 16-bit type: a plain copy */
                int64_t avail = n - r * ROW, m = avail < ROW ? (avail > 0 ? avail : 0) : ROW;
                memcpy(o, (const uint16_t *)in + r * ROW, (size_t)m * 2);
                memset(o + m, 0, (size_t)(ROW - m) * 2);
                continue;
            }
            load_row(in, in_type, r * ROW, n, buf);
            encode_row(buf, kind, bits, (uint8_t *)o, 0);
        }
        return 0;
    }
    for (int64_t r = 0; r < rows; r++) {
#ifdef QR_SIMD
        if (in_type == 1 && (r + 1) * ROW <= n) { /* full bf16 row: no fp32 copy of it */
            uint8_t codes[ROW], *orow = out + r * row_bytes;
            int done = simd_encode_row_bf16((const uint16_t *)in + r * ROW, kind, bits, orow, code_bytes, codes);
            if (done == 0) pack_planes(codes, bits, orow);
            if (done >= 0) continue; /* < 0: a block needs the extended scale: the general path below */
        }
#endif
        load_row(in, in_type, r * ROW, n, buf);
        encode_row(buf, kind, bits, out + r * row_bytes, code_bytes);
    }
    return 0;
}

/* 512 when this build also uses qr_avx512.h, 256 when it uses the AVX2/F16C intrinsics of
 * qr_avx2.h, 0 for the portable loops (benchmark labels). */
int qr_has_simd(void) {
#if defined(QR_SIMD512)
    return 512;
#elif defined(QR_SIMD)
    return 256;
#else
    return 0;
#endif
}

static const float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* One wire row -> its first m values as floats. */
static void decode_row(const uint8_t *row, int kind, int bits, int64_t code_bytes, float *vals, int64_t m) {
    uint8_t codes[ROW];
    const float bias = (float)(1 << (bits - 1));
    if (kind == 4) {
        memcpy(vals, row, (size_t)m * sizeof(float));
        return;
    }
    if (kind >= 2) {
        const uint16_t *w = (const uint16_t *)row;
        if (kind == 2)
            for (int64_t i = 0; i < m; i++) { uint32_t b = ((uint32_t)w[i]) << 16; memcpy(&vals[i], &b, 4); }
        else
            for (int64_t i = 0; i < m; i++) { _Float16 h; memcpy(&h, &w[i], 2); vals[i] = (float)h; }
        return;
    }
    uint16_t scales[NBLK];
    memcpy(scales, row + code_bytes, sizeof scales);
#ifdef QR_SIMD512
    if (kind == 0 && bits == 4) { /* straight from the nibbles */
        for (int b = 0; b < NBLK && b * BLK < m; b++) simd512_int4_decode(row + b * BLK / 2, scale_value(scales[b]), vals + b * BLK);
        return;
    }
#endif
    unpack_planes(row, kind == 0 ? bits : 4, codes);
    for (int b = 0; b < NBLK; b++) {
        float s = scale_value(scales[b]);
        const uint8_t *c = codes + b * BLK;
        float *v = vals + b * BLK;
#ifdef QR_SIMD
        simd_block_decode(kind, bias, c, s, v);
        continue;
#endif
        if (kind == 0)
            for (int j = 0; j < BLK; j++) v[j] = ((float)c[j] - bias) * s;
        else
            for (int j = 0; j < BLK; j++) v[j] = E2M1[c[j] & 15] * s;
    }
}

/* m float32 values to bf16 (round to nearest even, as torch). */
static void store_bf16(const float *v, uint16_t *o, int64_t m) {
    int64_t i = 0;
#if defined(QR_SIMD512)
    simd512_to_bf16(v, o, m);
    i = m & ~(int64_t)15;
#elif defined(QR_SIMD)
    simd_to_bf16(v, o, m);
    i = m & ~(int64_t)15;
#endif
    for (; i < m; i++) o[i] = to_bf16(v[i]);
}

/* Quantized values bound for fp16: |v| in (65504, 65536) -> +-65504 (see fast.saturate_f16). */
static void saturate_f16(float *v, int64_t m) {
    for (int64_t i = 0; i < m; i++) {
        float a = fabsf(v[i]);
        v[i] = (a > F16_MAX && a < 65536.0f) ? copysignf(F16_MAX, v[i]) : v[i];
    }
}

/* out_type 0: fp32 (accumulate: add into out), 1: bf16, 2: fp16. Writes the first n values;
 * quantized kinds saturate fp16 output as saturate_f16. wire_bytes / out_len: the sizes of wire
 * (bytes) and out (values). Returns 0, or -1 (nothing touched) when n needs more rows than the
 * wire holds, more values than out holds, or the layout is not one of ours. */
int qr_decode(const uint8_t *wire, int64_t rows, int kind, int bits, int64_t row_bytes, int64_t code_bytes,
              void *out, int64_t n, int accumulate, int out_type, int64_t wire_bytes, int64_t out_len) {
    float vals[ROW];
    if (!layout_ok(kind, bits, row_bytes, code_bytes) || out_type < 0 || out_type > 2 || n < 0 || n > out_len
        || !fits(rows, row_bytes, wire_bytes) || rows > INT64_MAX / ROW || n > rows * ROW
        || (accumulate && out_type != 0))
        return -1;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = wire + r * row_bytes;
        int64_t start = r * ROW;
        if (start >= n) break;
        int64_t m = n - start < ROW ? n - start : ROW;
#ifdef QR_SIMD
        if (out_type == 1 && kind <= 1 && m == ROW) { /* bf16 out, full row: no fp32 row in between */
            uint8_t codes[ROW];
            const uint8_t *c = row;
            if (kind == 0 && bits != 4 && bits != 8) { unpack_planes(row, bits, codes); c = codes; }
            simd_decode_row_bf16(row, kind, bits, code_bytes, c, (uint16_t *)out + start);
            continue;
        }
#endif
        decode_row(row, kind, bits, code_bytes, vals, m);
        if (out_type == 0) {
            float *o = (float *)out + start;
            if (accumulate)
                for (int64_t i = 0; i < m; i++) o[i] += vals[i];
            else
                memcpy(o, vals, (size_t)m * sizeof(float));
        } else if (out_type == 1) {
            store_bf16(vals, (uint16_t *)out + start, m);
        } else {
            _Float16 *o = (_Float16 *)out + start;
            int64_t i = 0;
            if (kind <= 1) saturate_f16(vals, m);
#ifdef QR_SIMD
            simd_to_f16(vals, (uint16_t *)o, m);
            i = m & ~(int64_t)7;
#endif
            for (; i < m; i++) o[i] = (_Float16)vals[i];
        }
    }
    return 0;
}

/* The middle of the two-shot all-reduce, fused per row: decode the nw contributions of a segment,
 * add them in fp32 in the given order (the first one, then += each next: the same additions as
 * decode + decode(accumulate)), when clamp > 0 (float16 input) saturate each contribution as
 * saturate_f16 and bound the sums as fast.fp16_sums (|sum| >=
 * 65520 -> +-clamp, (65504, 65520) -> +-65504, NaN stays NaN), and encode the sum into out. The
 * fp32 sum never leaves L1. wire_bytes[j] / out_bytes: the buffers' sizes. Returns 0, or -1
 * (nothing touched) when a wire or out is shorter than rows rows or the layout is not ours. */
int qr_reduce(const uint8_t *const *wires, int nw, int64_t rows, int kind, int bits, int64_t row_bytes,
              int64_t code_bytes, float clamp, uint8_t *out, const int64_t *wire_bytes, int64_t out_bytes) {
    float acc[ROW], vals[ROW];
    if (nw < 1 || !layout_ok(kind, bits, row_bytes, code_bytes) || !fits(rows, row_bytes, out_bytes)) return -1;
    for (int j = 0; j < nw; j++)
        if (!fits(rows, row_bytes, wire_bytes[j])) return -1;
    for (int64_t r = 0; r < rows; r++) {
        decode_row(wires[0] + r * row_bytes, kind, bits, code_bytes, acc, ROW);
        if (clamp > 0) saturate_f16(acc, ROW); /* an fp16 input's value is within fp16 range */
        for (int j = 1; j < nw; j++) {
            decode_row(wires[j] + r * row_bytes, kind, bits, code_bytes, vals, ROW);
            if (clamp > 0) saturate_f16(vals, ROW);
            for (int i = 0; i < ROW; i++) acc[i] += vals[i];
        }
        if (clamp > 0)
            for (int i = 0; i < ROW; i++) {
                float a = fabsf(acc[i]);
                acc[i] = a >= 65520.0f ? copysignf(clamp, acc[i]) : (a > F16_MAX ? copysignf(F16_MAX, acc[i]) : acc[i]);
            }
        encode_row(acc, kind, bits, out + r * row_bytes, code_bytes);
    }
    return 0;
}
#include "qr_channels.h"
