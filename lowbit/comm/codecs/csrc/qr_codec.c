/* Fused CPU encoder/decoder of the all-reduce wire formats (see ../spec.py, ../reference.py).
 * One pass per 2048-value row: block scales, codes and bit planes without temporaries.
 * Bit-exact to the torch implementations: IEEE fp32 divide, rint (round half to even),
 * fp16 scales via _Float16 (round to nearest even), integer scales rounded away from zero
 * when fp16 rounding shrank them. Build: cc -O3 -shared -fPIC (no -ffast-math). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ROW 2048
#define BLK 32
#define NBLK (ROW / BLK)
#define HALF_NAN 0x7E00u
#define HALF_ONE 0x3C00u

static inline uint16_t h_bits(_Float16 h) { uint16_t b; memcpy(&b, &h, 2); return b; }
static inline _Float16 h_from(uint16_t b) { _Float16 h; memcpy(&h, &b, 2); return h; }

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

static inline __attribute__((always_inline)) void pack_plane(const uint8_t *codes, int shift, int w, uint8_t *out) {
    const int per = 8 / w;
    const uint8_t mask = (uint8_t)((1u << w) - 1u);
    for (int i = 0; i < ROW / per; i++) {
        uint8_t byte = 0;
        for (int j = 0; j < per; j++) byte |= (uint8_t)(((codes[i * per + j] >> shift) & mask) << (j * w));
        out[i] = byte;
    }
}

static inline __attribute__((always_inline)) void unpack_plane(const uint8_t *in, int shift, int w, uint8_t *codes) {
    const int per = 8 / w;
    const uint8_t mask = (uint8_t)((1u << w) - 1u);
    for (int i = 0; i < ROW / per; i++)
        for (int j = 0; j < per; j++) codes[i * per + j] |= (uint8_t)(((in[i] >> (j * w)) & mask) << shift);
}

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
    memset(codes, 0, ROW);
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

/* kind 0: symmetric integer (bits 3..8), kind 1: FP4 E2M1, 2/3: FP with a bf16/fp16 wire. in_type 0 f32, 1 bf16, 2 f16. */
void qr_encode(const void *in, int in_type, int64_t n, int64_t rows, int kind, int bits,
               uint8_t *out, int64_t row_bytes, int64_t code_bytes) {
    float buf[ROW];
    uint8_t codes[ROW];
    const int qmin = -(1 << (bits - 1)), qmax = (1 << (bits - 1)) - 1, bias = 1 << (bits - 1);
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
            if (kind == 2)
                for (int i = 0; i < ROW; i++) o[i] = to_bf16(buf[i]);
            else
                for (int i = 0; i < ROW; i++) { _Float16 h = (_Float16)buf[i]; memcpy(&o[i], &h, 2); }
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        load_row(in, in_type, r * ROW, n, buf);
        uint16_t *scales = (uint16_t *)(out + r * row_bytes + code_bytes);
        for (int b = 0; b < NBLK; b++) {
            const float *x = buf + b * BLK;
            uint8_t *c = codes + b * BLK;
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
                if (kind == 0) {
                    float s32 = x[bi] / (float)qmin;
                    h = (_Float16)s32;
                    if (fabsf((float)h) < fabsf(s32)) h = h_from((uint16_t)(h_bits(h) + 1u)); /* away from 0 */
                } else {
                    h = (_Float16)(best / 6.0f);
                }
                if (isinf((float)h)) bad = 1;
            }
            if (bad) {
                memset(c, 0, BLK);
                scales[b] = HALF_NAN;
                continue;
            }
            uint16_t hb = h_bits(h);
            if ((hb & 0x7FFFu) == 0) { hb = HALF_ONE; h = h_from(hb); }
            scales[b] = hb;
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
                    float v = x[j] / s, a = fabsf(v);
                    int idx = (a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) + (a > 5.0f)
                              + (a == 0.75f) + (a == 1.75f) + (a == 3.5f);
                    c[j] = (uint8_t)(idx | ((v < 0.0f) << 3));
                }
            }
        }
        pack_planes(codes, kind == 0 ? bits : 4, out + r * row_bytes);
    }
}

static const float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* out_type 0: fp32 (accumulate: add into out), 1: bf16, 2: fp16. Writes the first n values. */
void qr_decode(const uint8_t *wire, int64_t rows, int kind, int bits, int64_t row_bytes, int64_t code_bytes,
               void *out, int64_t n, int accumulate, int out_type) {
    uint8_t codes[ROW];
    float vals[ROW];
    const float bias = (float)(1 << (bits - 1));
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = wire + r * row_bytes;
        int64_t start = r * ROW;
        if (start >= n) break;
        int64_t m = n - start < ROW ? n - start : ROW;
        if (kind >= 2) {
            const uint16_t *w = (const uint16_t *)row;
            if (kind == 2)
                for (int64_t i = 0; i < m; i++) { uint32_t b = ((uint32_t)w[i]) << 16; memcpy(&vals[i], &b, 4); }
            else
                for (int64_t i = 0; i < m; i++) { _Float16 h; memcpy(&h, &w[i], 2); vals[i] = (float)h; }
        } else {
        unpack_planes(row, kind == 0 ? bits : 4, codes);
        uint16_t scales[NBLK];
        memcpy(scales, row + code_bytes, sizeof scales);
        for (int b = 0; b < NBLK; b++) {
            float s = (float)h_from(scales[b]);
            const uint8_t *c = codes + b * BLK;
            float *v = vals + b * BLK;
            if (kind == 0)
                for (int j = 0; j < BLK; j++) v[j] = ((float)c[j] - bias) * s;
            else
                for (int j = 0; j < BLK; j++) v[j] = E2M1[c[j] & 15] * s;
        }
        }
        if (out_type == 0) {
            float *o = (float *)out + start;
            if (accumulate)
                for (int64_t i = 0; i < m; i++) o[i] += vals[i];
            else
                memcpy(o, vals, (size_t)m * sizeof(float));
        } else if (out_type == 1) {
            uint16_t *o = (uint16_t *)out + start;
            for (int64_t i = 0; i < m; i++) o[i] = to_bf16(vals[i]);
        } else {
            _Float16 *o = (_Float16 *)out + start;
            for (int64_t i = 0; i < m; i++) o[i] = (_Float16)vals[i];
        }
    }
}
