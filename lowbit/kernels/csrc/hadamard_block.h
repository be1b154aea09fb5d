/* x[0 .. block) times H_block / sqrt(block) for a power-of-two block, in the operations of
 * lowbit.formats.hadamard.fast_transform (so its bits): the online Hadamards of rotated linears
 * (hadamard.c) and of the INT4 KV cache's heads (decode_ops.c). Include after the C headers. */
#ifndef LOWBIT_HADAMARD_BLOCK_H
#define LOWBIT_HADAMARD_BLOCK_H

/* Spans 1, 2, 4 (and 8) of the butterfly inside one vector: butterfly_simd.h (shared with the
 * all-reduce codecs). */
#if defined(__AVX2__)
#include <immintrin.h>
#include "../../native/csrc/butterfly_simd.h"
#endif

#if defined(__AVX512F__)
#define VW 16
#define VF __m512
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VSET1 _mm512_set1_ps
#define VSTAGES butterfly_in16
#elif defined(__AVX2__)
#define VW 8
#define VF __m256
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VSET1 _mm256_set1_ps
#define VSTAGES butterfly_in8
#endif

/* x[0 .. block) times H_block, then times scale (block a power of two). Spans below the vector
 * width in registers, the wider ones between whole vectors (loads and stores of one width, so
 * the next stage's loads are forwarded from the last stage's stores). */
static void butterfly(float *x, int64_t block, float scale) {
    int64_t h = 1;
#if defined(VW)
    if (block >= VW) {
        for (int64_t i = 0; i < block; i += VW) VSTORE(x + i, VSTAGES(VLOAD(x + i)));
        for (h = VW; h < block; h *= 2)
            for (int64_t i = 0; i < block; i += 2 * h)
                for (int64_t j = i; j < i + h; j += VW) {
                    VF a = VLOAD(x + j), c = VLOAD(x + j + h);
                    VSTORE(x + j, VADD(a, c));
                    VSTORE(x + j + h, VSUB(a, c));
                }
        VF sv = VSET1(scale);
        for (int64_t i = 0; i < block; i += VW) VSTORE(x + i, VMUL(VLOAD(x + i), sv));
        return;
    }
#endif
    for (; h < block; h *= 2)
        for (int64_t i = 0; i < block; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                float a = x[j], c = x[j + h];
                x[j] = a + c;
                x[j + h] = a - c;
            }
    for (int64_t i = 0; i < block; i++) x[i] *= scale;
}

#endif
