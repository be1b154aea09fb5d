/* Peak rates of this CPU's 512-bit multiply-add instructions on one core (what a GEMM can reach).
 *
 *     gcc -O2 scripts/dot_rates.c -o /tmp/dot_rates && /tmp/dot_rates
 *
 * Twelve independent accumulators per instruction kind, so neither latency nor loads limit it:
 * fp32 FMA (32 flops), bf16 VDPBF16PS (32 pair products, 64 flops), int16 VPDPWSSD (32 pair
 * products) and int8 VPDPBUSD (64 quad products); G operations per second, three rounds. On a CPU
 * without AVX512_BF16 or VNNI those rows fault: run it where `lowbit env` lists them. It shows, for
 * example, that int16 dot products run no faster than bf16 ones where both exist, so an exact
 * int16 W4A16 kernel can at best tie a bf16 matmul that runs near that peak. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define N 100000000L
#define R12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define BENCH(name, T, TGT, INIT, OP, X, Y, OPS)                                          \
__attribute__((target(TGT))) static double name(void) {                                   \
    T x = X, y = Y;                                                                        \
    _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")                                  \
    R12(INIT)                                                                              \
    double t = now();                                                                      \
    for (long n = 0; n < N / 12; n++) { R12(OP) __asm__ volatile("" : "+v"(x), "+v"(y)); } \
    t = now() - t;                                                                         \
    volatile T sink; R12(SINK)                                                             \
    return (N / 12 * 12) * (double)(OPS) / t / 1e9;                                        \
}
#define SINK(i) sink = a##i;
#define IF(i) __m512 a##i = _mm512_set1_ps(i);
#define II(i) __m512i a##i = _mm512_set1_epi32(i);
#define OFMA(i) a##i = _mm512_fmadd_ps(x, y, a##i);
#define OBF(i) a##i = _mm512_dpbf16_ps(a##i, (__m512bh)x, (__m512bh)y);
#define OW(i) a##i = _mm512_dpwssd_epi32(a##i, x, y);
#define OB(i) a##i = _mm512_dpbusd_epi32(a##i, x, y);
BENCH(fma32, __m512, "avx512f", IF, OFMA, _mm512_set1_ps(1.0f), _mm512_set1_ps(1e-9f), 32)
BENCH(bf16, __m512, "avx512f,avx512bf16", IF, OBF, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f803f80)), _mm512_castsi512_ps(_mm512_set1_epi32(0x00010001)), 64)
BENCH(w16, __m512i, "avx512f,avx512vnni", II, OW, _mm512_set1_epi32(0x00010002), _mm512_set1_epi32(0x00030001), 64)
BENCH(b8, __m512i, "avx512f,avx512vnni", II, OB, _mm512_set1_epi32(0x01020304), _mm512_set1_epi32(0x01010101), 128)
int main(void) {
    for (int r = 0; r < 3; r++)
        printf("one core, G ops/s: fp32 fma %.1f | bf16 vdpbf16ps %.1f | int16 vpdpwssd %.1f | int8 vpdpbusd %.1f\n", fma32(), bf16(), w16(), b8());
}
