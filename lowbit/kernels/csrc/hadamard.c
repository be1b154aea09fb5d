/* The online Hadamards of rotated quantized linears (lowbit.nn.online_hadamard).
 *
 * block_hadamard (BlockHadamard):
 * per row, the first `normal` channels in blocks of `block` (a power of two <= 128) times
 * H_block / sqrt(block), the trailing outlier channels copied. In PyTorch that is a chain of
 * stack/reshape calls per butterfly stage (about 0.35 ms per call at one token on 576 channels,
 * several times per decoder layer); here it is one pass in L1 per row.
 *
 * The operations are lowbit.formats.hadamard.fast_transform's: stages of span 1, 2, 4, ... with
 * a + b into the lower and a - b into the upper position, then one float32 multiply by `scale`;
 * bfloat16 rows are widened exactly, transformed in float32 and rounded once (torch's .float(),
 * the transform, then .to(bfloat16)). So the bits are the torch path's (tested), in every build:
 * the vector spans use lane permutes with the same operand order. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "work_pool.h"

#define MAX_BLOCK 128

#include "hadamard_block.h"

struct block_job {
    const void *x;
    void *y;
    const int64_t *perm;
    int64_t rows, n, x_stride, normal;
    int bf16, block;
    float scale;
};

#define BH_ROWS 8 /* rows per work item */

static void block_item(const void *ctx, int64_t item) {
    const struct block_job *J = ctx;
    float buf[MAX_BLOCK];
    const int64_t n = J->n, normal = J->normal, block = J->block;
    const int64_t *perm = J->perm;
    const int bf16 = J->bf16;
    const size_t es = bf16 ? 2 : 4;
    const int64_t r1 = (item + 1) * BH_ROWS < J->rows ? (item + 1) * BH_ROWS : J->rows;
    for (int64_t r = item * BH_ROWS; r < r1; r++) {
        int64_t xo = r * J->x_stride, yo = r * n;
        for (int64_t b = 0; b < normal; b += block) {
            int64_t i = 0;
            if (perm) {
                for (; i < block; i++) buf[i] = act_at(J->x, bf16, xo + perm[b + i]);
            } else {
#if defined(__AVX2__)
                for (; i + 8 <= block; i += 8) _mm256_storeu_ps(buf + i, act_load8(J->x, bf16, xo + b + i));
#endif
                for (; i < block; i++) buf[i] = act_at(J->x, bf16, xo + b + i);
            }
            butterfly(buf, block, J->scale);
            if (bf16)
                f32_to_bf16_row((uint16_t *)J->y + yo + b, buf, block);
            else
                memcpy((float *)J->y + yo + b, buf, (size_t)block * sizeof(float));
        }
        if (!perm) {
            memcpy((uint8_t *)J->y + (size_t)(yo + normal) * es, (const uint8_t *)J->x + (size_t)(xo + normal) * es,
                   (size_t)(n - normal) * es);
        } else if (bf16) {
            for (int64_t j = normal; j < n; j++) ((uint16_t *)J->y)[yo + j] = ((const uint16_t *)J->x)[xo + perm[j]];
        } else {
            for (int64_t j = normal; j < n; j++) ((float *)J->y)[yo + j] = ((const float *)J->x)[xo + perm[j]];
        }
    }
}

/* x, y: rows x n values, float32 (bf16 = 0) or bfloat16 (bf16 = 1), row strides x_stride and
 * n (y contiguous). perm (NULL: none): row j of the result reads x's channel perm[j] (the outlier
 * reorder the -rot presets' transform follows, gathered here instead of in a pass of its own; the
 * same values, so the same bits). Rows in items of BH_ROWS on up to `threads` threads (work_pool.h)
 * when the call is large enough. Returns 0, or -1 (nothing written) for a block that is not a
 * power of two in [2, MAX_BLOCK], a `normal` that is not a multiple of it within n, or an index of
 * perm outside the row. */
int block_hadamard(const void *x, int bf16, int64_t rows, int64_t n, int64_t x_stride, int64_t normal, int block,
                   float scale, void *y, const int64_t *perm, int threads) {
    if (block < 2 || block > MAX_BLOCK || (block & (block - 1)) || normal < 0 || normal > n || normal % block
        || rows < 0 || x_stride < n)
        return -1;
    for (int64_t j = 0; perm && j < n; j++)
        if (perm[j] < 0 || perm[j] >= n) return -1;
    const struct block_job J = {x, y, perm, rows, n, x_stride, normal, bf16, block, scale};
    const int64_t items = (rows + BH_ROWS - 1) / BH_ROWS;
    pool_run(block_item, &J, items, rows * n >= 65536 ? threads : 1);
    return 0;
}

static void widen_row(const void *x, int bf16, int64_t xo, int64_t n, float *out) {
    if (!bf16) {
        memcpy(out, (const float *)x + xo, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = (const uint16_t *)x + xo;
    for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(h[i]);
}

/* input_hadamard (InputHadamard, QuaRot's R4 at down_proj): each whole row of n = p * m values
 * times H_p (x) H_m / sqrt(n), H_p Sylvester (p a power of two), H_m a small +-1 matrix given as
 * `signs` (m * m floats, row-major). fast_transform's operations per value: for each group a of m
 * consecutive values, the product with H_m as an ordered sum (row 0's term, then + row d's term;
 * the +-1 products are exact, so a contracted multiply-add rounds the same), then butterfly stages
 * over a (spans m, 2m, ... in the row), then one multiply by `scale`. The row is held transposed
 * ([m][p]) so that both steps run along contiguous p-long vectors, and each of the m vectors goes
 * through the block butterfly above. Returns 0, -1 (bad sizes, nothing written) or -2 (no memory). */
int input_hadamard(const void *x, int bf16, int64_t rows, int64_t n, int64_t x_stride, int64_t p, int64_t m,
                   const float *signs, float scale, void *y) {
    if (p < 1 || (p & (p - 1)) || m < 1 || p * m != n || rows < 0 || x_stride < n) return -1;
    float *xt = malloc((size_t)n * sizeof(float)), *yt = malloc((size_t)n * sizeof(float));
    if (!xt || !yt) {
        free(xt);
        free(yt);
        return -2;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t xo = r * x_stride, yo = r * n;
        float *out = m == 1 ? xt : yt;
        if (m == 1)
            widen_row(x, bf16, xo, n, xt);
        else
            for (int64_t a = 0; a < p; a++) /* xt[d][a] = x[a][d] */
                for (int64_t d = 0; d < m; d++) xt[d * p + a] = act_at(x, bf16, xo + a * m + d);
        for (int64_t j = 0; m > 1 && j < m; j++) {
            float *yj = yt + j * p;
            const float s0 = signs[j];
            for (int64_t a = 0; a < p; a++) yj[a] = s0 * xt[a];
            for (int64_t d = 1; d < m; d++) {
                const float s = signs[d * m + j], *xd = xt + d * p;
                for (int64_t a = 0; a < p; a++) yj[a] = yj[a] + s * xd[a];
            }
        }
        for (int64_t j = 0; j < m; j++) butterfly(out + j * p, p, scale);
        if (m == 1 && bf16)
            for (int64_t i = 0; i < n; i++) ((uint16_t *)y)[yo + i] = f32_to_bf16(out[i]);
        else if (m == 1)
            memcpy((float *)y + yo, out, (size_t)n * sizeof(float));
        else
            for (int64_t a = 0; a < p; a++)
                for (int64_t j = 0; j < m; j++) {
                    float v = out[j * p + a];
                    if (bf16)
                        ((uint16_t *)y)[yo + a * m + j] = f32_to_bf16(v);
                    else
                        ((float *)y)[yo + a * m + j] = v;
                }
    }
    free(xt);
    free(yt);
    return 0;
}
