/* Dynamic per-token symmetric activation codes for the integer kernels (W4A4, W8A8), the same bits
 * as lowbit/kernels/token_codes.py: per block, the scale is the block's signed absmax (the first of
 * equal magnitudes, as torch.argmax) times clip over -2^(bits-1), or with `half` compressed-tensors'
 * rule, absmax times clip over (2^bits - 1) / 2 (either 1 when it is 0), and the codes
 * are x / scale rounded half to even and clamped to [-2^(bits-1), 2^(bits-1) - 1]. In torch this is
 * a dozen operator calls per linear, each a pass over the activations and a thread fork/join; here
 * it is one pass per block, and the codes come out as the int16 rows the GEMV kernels read. */
#ifndef LOWBIT_ACT_SYM_H
#define LOWBIT_ACT_SYM_H
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#if defined(__AVX2__) && !defined(PANEL_NO_SIMD)
#include <immintrin.h>
#endif

#include "act_round.h"
#include "row_order.h"
#include "work_pool.h"

/* Codes of x[a:b] into q[0:b-a]; their sum into *sum; the scale returned (NaN if a value is not
 * finite). The signed rule's scale has the sign of the first value of largest magnitude
 * (torch.argmax's first); the half-range rule's is positive. */
static float act_sym_block(const void *x, int bf16, int64_t a, int64_t b, int bits, float clip, int half,
                           int16_t *q, int32_t *sum) {
    int finite = 1;
    const float amax = act_absmax(x, bf16, a, b, &finite);
    if (!finite) return NAN;
    const float lo = -(float)(1 << (bits - 1)), hi = (float)((1 << (bits - 1)) - 1);
    float s;
    if (half) {
        s = amax * clip / ((hi - lo) / 2.f);
    } else {
        const float v = a < b ? act_at(x, bf16, act_first_magnitude(x, bf16, a, b, amax)) : 0.f;
        s = v * clip / lo;
    }
    if (s == 0.f) s = 1.f;
    *sum = act_round_codes(x, bf16, a, b, s, lo, hi, q);
    return s;
}

/* x [t, n_in] (float32, or bfloat16 when bf16), outlier channels last (n_in - n of them):
 * the n normal channels in groups of `group` (ng groups) -> xq [t, kp] int16 (zero padded past n),
 * sx [t, ng] scales and xsum [t, ng] code sums; the outliers as INT8 codes per token -> oq [t, n_in
 * - n] int16 and osx [t]. Returns the number of tokens with a NaN/Inf value (0: all written). */
static int64_t act_sym_tokens(const void *x, int bf16, int64_t t, int64_t n_in, int64_t n, int64_t group, int64_t ng,
                              int64_t kp, int bits, float clip, int half, int16_t *xq, float *sx, int32_t *xsum,
                              int16_t *oq, float *osx) {
    int64_t bad = 0;
    const int64_t k = n_in - n;
    for (int64_t i = 0; i < t; i++) {
        int ok = 1;
        int16_t *qr = xq + i * kp;
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * group, b = a + group < n ? a + group : n;
            float s = act_sym_block(x, bf16, i * n_in + a, i * n_in + b, bits, clip, half, qr + a, xsum + i * ng + g);
            ok &= !isnan(s);
            sx[i * ng + g] = s;
        }
        for (int64_t j = n; j < kp; j++) qr[j] = 0;
        if (k > 0) {
            int32_t unused;
            osx[i] = act_sym_block(x, bf16, i * n_in + n, (i + 1) * n_in, 8, 1.f, 0, oq + i * k, &unused);
            ok &= !isnan(osx[i]);
        } else {
            osx[i] = 1.f;
        }
        bad += !ok;
    }
    return bad;
}

/* act_sym_tokens over the work pool (work_pool.h), blocks of `block` tokens, each first reordered as
 * x[:, perm] into xg when order is not NULL (a layer's input reorder, row_order.h: the same values,
 * so the same codes): each token's codes are computed alone, so the same bits for any thread count. */
#define ACT_SYM_BLOCK 16 /* the exported entry point's blocks */
struct act_sym_job {
    const void *x;
    int bf16, bits, half;
    const struct row_order *order; /* the reorder of n_in channels, or NULL */
    void *xg; /* [t, n_in], x's element size, when order is not NULL */
    int64_t t, n_in, n, group, ng, kp, block;
    float clip;
    int16_t *xq, *oq;
    float *sx, *osx;
    int32_t *xsum;
    _Atomic int64_t bad; /* tokens with a NaN or Inf */
};

static void act_sym_item(const void *ctx, int64_t item) {
    struct act_sym_job *J = (struct act_sym_job *)ctx; /* only `bad` is written, atomically */
    const int64_t i0 = item * J->block, cnt = J->t - i0 < J->block ? J->t - i0 : J->block;
    const size_t esz = J->bf16 ? 2 : 4;
    const char *x = (const char *)J->x + (size_t)(i0 * J->n_in) * esz;
    if (J->order) {
        char *g = (char *)J->xg + (size_t)(i0 * J->n_in) * esz;
        for (int64_t i = 0; i < cnt; i++)
            order_row(x + (size_t)(i * J->n_in) * esz, J->bf16, J->order, i0 + i + 1 < J->t,
                      g + (size_t)(i * J->n_in) * esz);
        x = g;
    }
    int64_t bad = act_sym_tokens(x, J->bf16, cnt, J->n_in, J->n, J->group, J->ng, J->kp, J->bits, J->clip,
                                 J->half, J->xq + i0 * J->kp, J->sx + i0 * J->ng, J->xsum + i0 * J->ng,
                                 J->oq + i0 * (J->n_in - J->n), J->osx + i0);
    if (bad) atomic_fetch_add(&J->bad, bad);
}

/* The exported entry point a library gives its callers (each library its own name). */
#define ACT_SYM_EXPORT(name)                                                                                       \
    int64_t name(const void *x, int bf16, int64_t t, int64_t n_in, int64_t n, int64_t group, int64_t ng, int64_t kp, \
                 int bits, float clip, int half, int16_t *xq, float *sx, int32_t *xsum, int16_t *oq, float *osx,  \
                 int threads) {                                                                                    \
        if (t <= ACT_SYM_BLOCK || threads <= 1)                                                                    \
            return act_sym_tokens(x, bf16, t, n_in, n, group, ng, kp, bits, clip, half, xq, sx, xsum, oq, osx);  \
        struct act_sym_job J = {.x = x, .bf16 = bf16, .bits = bits, .half = half, .t = t, .n_in = n_in, .n = n,   \
                                .group = group, .ng = ng, .kp = kp, .block = ACT_SYM_BLOCK, .clip = clip, .xq = xq, \
                                .oq = oq, .sx = sx, .osx = osx, .xsum = xsum};                                     \
        pool_run(act_sym_item, &J, (t + ACT_SYM_BLOCK - 1) / ACT_SYM_BLOCK, threads);                             \
        return atomic_load(&J.bad);                                                                                \
    }
#endif
