/* Shared by the native A16 kernels (W4A16, W8A16): the rounding of activations to int16 codes per
 * group (scale = absmax / 32767, round half to even; the per-value steps in act_round.h, whose
 * ACT_SIMD the includer defines), read straight from the caller's float32 or bfloat16 rows, and
 * the driver of one whole linear (a16_linear).
 */
#ifndef LOWBIT_ACT_INT16_H
#define LOWBIT_ACT_INT16_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "act_round.h"

/* Token rows x [t, k] (float32, or bfloat16 when bf16) -> xq [t, kp] int16 (zero padded), sx
 * [t, ng] the groups' steps (absmax / 32767; 1 for an all-zero group) and, when xsum is not NULL,
 * xsum [t, ng] the exact sums of each group's codes. A group with NaN/Inf gets a NaN step (so the
 * token's outputs are NaN) and zero codes. */
static void quant_act(const void *x, int bf16, int64_t t, int64_t k, int64_t kp, int64_t group, int64_t ng,
                      int16_t *xq, float *sx, int32_t *xsum) {
    for (int64_t i = 0; i < t; i++) {
        int16_t *qr = xq + i * kp;
        for (int64_t g = 0; g < ng; g++) {
            int64_t a = g * group, b = a + group < k ? a + group : k;
            int finite = 1;
            float amax = a < b ? act_absmax(x, bf16, i * k + a, i * k + b, &finite) : 0.f;
            float s = !finite ? NAN : amax > 0.f ? amax / 32767.f : 1.f;
            if (s == 0.f) s = 0x1p-149f; /* amax < 2^-135: the smallest step still covers it */
            int32_t sum = 0;
            if (finite)
                sum = a < b ? act_round_codes(x, bf16, i * k + a, i * k + b, s, -32767.f, 32767.f, qr + a) : 0;
            else if (a < b)
                memset(qr + a, 0, (size_t)(b - a) * sizeof(int16_t));
            sx[i * ng + g] = s;
            if (xsum) xsum[i * ng + g] = sum;
        }
        for (int64_t j = k; j < kp; j++) qr[j] = 0;
    }
}

/* The weight half of an A16 linear: int16 codes xq [t, kp], their steps sx [t, ng] and (when the
 * linear asked for them) code sums xsum [t, ng] -> y [t, out] float32. */
typedef void (*a16_gemv_fn)(const void *weight, const int16_t *xq, const float *sx, const int32_t *xsum, int64_t t,
                            float *y, int threads);

/* One A16 linear, one crossing from Python: x [t, k] float32 (x_bf16 = 0) or bfloat16 (1) is
 * rounded to int16 codes in groups of `group` (ng of them over kp padded channels), `gemv` runs,
 * and y [t, out] is written as float32 or bfloat16 (y_bf16). Returns 0, or -1 if out of memory. */
static int a16_linear(a16_gemv_fn gemv, const void *weight, int64_t out, int64_t k, int64_t kp, int64_t group,
                      int64_t ng, int sums, const void *x, int x_bf16, int64_t t, void *y, int y_bf16, int threads) {
    if (t <= 0) return 0;
    int16_t *xq = malloc((size_t)(t * kp) * sizeof(int16_t));
    float *sx = malloc((size_t)(t * ng) * sizeof(float));
    int32_t *xsum = sums ? malloc((size_t)(t * ng) * sizeof(int32_t)) : NULL;
    float *yf = y_bf16 ? malloc((size_t)(t * out) * sizeof(float)) : (float *)y;
    int rc = -1;
    if (!xq || !sx || (sums && !xsum) || !yf) goto done;
    quant_act(x, x_bf16, t, k, kp, group, ng, xq, sx, xsum);
    gemv(weight, xq, sx, xsum, t, yf, threads);
    if (y_bf16) f32_to_bf16_row((uint16_t *)y, yf, t * out);
    rc = 0;
done:
    free(xq), free(sx), free(xsum);
    if (y_bf16) free(yf);
    return rc;
}
#endif
