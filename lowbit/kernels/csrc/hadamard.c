/* The online block Hadamard of a rotated quantized linear (lowbit.nn.online_hadamard.BlockHadamard):
 * per row, the first `normal` channels in blocks of `block` (a power of two <= 128) times
 * H_block / sqrt(block), the trailing outlier channels copied. In PyTorch that is a chain of
 * stack/reshape calls per butterfly stage (about 0.35 ms per call at one token on 576 channels,
 * several times per decoder layer); here it is one pass in L1 per row.
 *
 * The operations are lowbit.formats.hadamard.fast_transform's: stages of span 1, 2, 4, ... with
 * a + b into the lower and a - b into the upper position, then one float32 multiply by `scale`;
 * bfloat16 rows are widened exactly, transformed in float32 and rounded once (torch's .float(),
 * the transform, then .to(bfloat16)). So the bits are the torch path's (tested), in every build:
 * the AVX2 spans 1-4 use lane permutes with the same operand order. */
#include <stdint.h>
#include <string.h>
#include "bf16.h"

#define MAX_BLOCK 128

static void butterfly(float *x, int block, float scale) {
    int h = 1;
#if defined(__AVX2__)
    if (block >= 8) {
        for (int i = 0; i < block; i += 8) {
            __m256 r = _mm256_loadu_ps(x + i), t = _mm256_permute_ps(r, 0xB1); /* span 1: lanes 1 0 3 2 */
            r = _mm256_blend_ps(_mm256_add_ps(r, t), _mm256_sub_ps(t, r), 0xAA);
            t = _mm256_permute_ps(r, 0x4E); /* span 2: lanes 2 3 0 1 */
            r = _mm256_blend_ps(_mm256_add_ps(r, t), _mm256_sub_ps(t, r), 0xCC);
            t = _mm256_permute2f128_ps(r, r, 0x01); /* span 4: halves swapped */
            _mm256_storeu_ps(x + i, _mm256_blend_ps(_mm256_add_ps(r, t), _mm256_sub_ps(t, r), 0xF0));
        }
        h = 8;
    }
#endif
    for (; h < block; h *= 2) /* spans of 8 and more vectorize as they are */
        for (int i = 0; i < block; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], c = x[j + h];
                x[j] = a + c;
                x[j + h] = a - c;
            }
    for (int i = 0; i < block; i++) x[i] *= scale;
}

/* x, y: rows x n values, float32 (bf16 = 0) or bfloat16 (bf16 = 1), row strides x_stride and
 * n (y contiguous). Returns 0, or -1 (nothing written) for a block that is not a power of two
 * in [2, MAX_BLOCK] or a `normal` that is not a multiple of it within n. */
int block_hadamard(const void *x, int bf16, int64_t rows, int64_t n, int64_t x_stride, int64_t normal, int block,
                   float scale, void *y) {
    float buf[MAX_BLOCK];
    if (block < 2 || block > MAX_BLOCK || (block & (block - 1)) || normal < 0 || normal > n || normal % block
        || rows < 0 || x_stride < n)
        return -1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t xo = r * x_stride, yo = r * n;
        for (int64_t b = 0; b < normal; b += block) {
            for (int i = 0; i < block; i++) buf[i] = act_at(x, bf16, xo + b + i);
            butterfly(buf, block, scale);
            if (bf16)
                for (int i = 0; i < block; i++) ((uint16_t *)y)[yo + b + i] = f32_to_bf16(buf[i]);
            else
                memcpy((float *)y + yo + b, buf, (size_t)block * sizeof(float));
        }
        size_t es = bf16 ? 2 : 4, tail = (size_t)(n - normal);
        memcpy((uint8_t *)y + (size_t)(yo + normal) * es, (const uint8_t *)x + (size_t)(xo + normal) * es, tail * es);
    }
    return 0;
}
