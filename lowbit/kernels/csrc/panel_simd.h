/* Shared by the batched kernels over row panels (i8_gemm.c, a16_gemm.c): the panel layout and one
 * set of vector macros for the widest build (AVX-512 BW: 16 int32 lanes; AVX2: 8; none: the
 * portable loops), so a kernel is written once for both widths.
 *
 * Panels: 16 output rows; per 4 input channels a 64-byte vector [16 rows][4 bytes] (INT8 codes),
 * or per 8 channels [16 rows][4 bytes] with channels 0-3 in the low nibbles and 4-7 in the high
 * ones (INT4); a vector of VL rows is a contiguous part of it (lowbit/kernels/cpu/i8_gemm.py, pack).
 * Weights are unsigned codes u with a zero point z; every product is an exact integer.
 *
 * -DPANEL_NO_SIMD forces the portable loops (the reference the tests compare every build with).
 */
#ifndef LOWBIT_PANEL_SIMD_H
#define LOWBIT_PANEL_SIMD_H
#include <stdint.h>
#include <string.h>

#include "work_pool.h"

#if defined(__AVX512BW__) && !defined(PANEL_NO_SIMD)
#define PANEL_SIMD 512
#elif defined(__AVX2__) && !defined(PANEL_NO_SIMD)
#define PANEL_SIMD 256
#else
#define PANEL_SIMD 0
#endif

#define PANEL 16 /* rows per panel */

/* Read the panel bytes PANEL_PREFETCH_BYTES past p into the cache now. A row tile streams its panels
 * (32 KB each at 4096 channels) once per call; the hardware prefetcher stops at every 4 KB page and
 * decode streams the weights from memory, so without this the small-batch tiles wait on memory
 * (measured on an AMX Xeon, 4096^2 W4A16 at 1 token from DRAM: 0.57 -> 0.50 ms on 2 threads).
 * A prefetch past the end of the panels is harmless (it never faults). */
#ifndef PANEL_PREFETCH_BYTES
#define PANEL_PREFETCH_BYTES 2048
#endif
#define PANEL_PREFETCH(p) __builtin_prefetch((const char *)(p) + PANEL_PREFETCH_BYTES, 0, 3)

/* 0: portable loop; 256 / 512: the vector width; +1 when the build's int8 dot product is VNNI's */
static inline int panel_simd_level(void) {
#if PANEL_SIMD == 512 && defined(__AVX512VNNI__)
    return 513;
#elif PANEL_SIMD == 256 && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    return 257;
#else
    return PANEL_SIMD;
#endif
}

/* Byte offset of row r's 4-byte group at channel k (r a multiple of VL where vectors are loaded). */
static inline int64_t panel_at(int64_t r, int64_t k, int64_t kp, int nibbles) {
    int64_t panel = r / PANEL, in_panel = (r % PANEL) * 4;
    return nibbles ? (panel * (kp / 8) + k / 8) * 64 + in_panel : (panel * (kp / 4) + k / 4) * 64 + in_panel;
}

/* Row r's unsigned code at channel k. */
static inline uint32_t panel_code(const uint8_t *w, int64_t r, int64_t k, int64_t kp, int nibbles) {
    if (!nibbles) return w[panel_at(r, k, kp, 0) + k % 4];
    uint8_t b = w[panel_at(r, k, kp, 1) + k % 4];
    return k % 8 < 4 ? (b & 15u) : (uint32_t)(b >> 4);
}

/* Portable: sum of row r's codes times x[a, b) (int8 when x_bytes is 1, else int16), wrapping modulo
 * 2^32 as the vector lanes do. */
static inline uint32_t panel_dot(const uint8_t *w, int nibbles, int64_t kp, int64_t r, int64_t a, int64_t b,
                                 const void *x, int x_bytes) {
    uint32_t acc = 0;
    for (int64_t k = a; k < b; k++)
        acc += panel_code(w, r, k, kp, nibbles) *
               (uint32_t)(x_bytes == 1 ? (int32_t)((const int8_t *)x)[k] : (int32_t)((const int16_t *)x)[k]);
    return acc;
}

/* *buf with room for need bytes (64-byte aligned), grown by a fresh allocation (the old contents
 * are not kept); NULL if it cannot be had. For the per-thread memory kernels keep between calls. */
static inline uint8_t *grow_buffer(uint8_t **buf, int64_t *cap, int64_t need) {
    if (need > *cap) {
        free(*buf);
        *buf = aligned_alloc(64, (size_t)(need + 63) / 64 * 64);
        *cap = *buf ? need : 0;
    }
    return *buf;
}

static inline int32_t load32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline int64_t load64(const void *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

#if PANEL_SIMD == 512
#include <immintrin.h>
typedef __m512i vi_t;
typedef __m512 vf_t;
#define VL 16
#define VLOAD(p) _mm512_loadu_si512((const void *)(p))
#define VBCAST32(p) _mm512_set1_epi32(load32(p))
#define VBCAST64(p) _mm512_set1_epi64(load64(p))
#define VZERO() _mm512_setzero_si512()
#define VMASK4(v) _mm512_and_si512((v), _mm512_set1_epi8(0x0F))
#define VSHR4(v) _mm512_and_si512(_mm512_srli_epi16((v), 4), _mm512_set1_epi8(0x0F))
#define VUNPLO8(v) _mm512_unpacklo_epi8((v), _mm512_setzero_si512())
#define VUNPHI8(v) _mm512_unpackhi_epi8((v), _mm512_setzero_si512())
#define VSUB32(a, b) _mm512_sub_epi32((a), (b))
#define VADD32(a, b) _mm512_add_epi32((a), (b))
#define VMUL32(a, b) _mm512_mullo_epi32((a), (b))
#define VSET32(v) _mm512_set1_epi32(v)
#define VLOAD32(p) _mm512_loadu_si512((const void *)(p))
#define VSLL4(a) _mm512_slli_epi32((a), 4)
#define VMADDUBS(a, b) _mm512_madd_epi16(_mm512_maddubs_epi16((a), (b)), _mm512_set1_epi16(1))
#define VMADDWD(a, b) _mm512_madd_epi16((a), (b))
#define VSHUF(a, b, imm) _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), (imm)))
#define FZERO() _mm512_setzero_ps()
#define FLOAD(p) _mm512_loadu_ps(p)
#define FSTORE(p, v) _mm512_storeu_ps((p), (v))
#define FSET(v) _mm512_set1_ps(v)
#define FMUL(a, b) _mm512_mul_ps((a), (b))
#define FADD(a, b) _mm512_add_ps((a), (b))
#define FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define FCVT(a) _mm512_cvtepi32_ps(a)
#if defined(__AVX512VNNI__)
#define DOT_VNNI 1
#define VDPBUSD(acc, u, x) _mm512_dpbusd_epi32((acc), (u), (x))
#define VDPWSSD(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#endif
#elif PANEL_SIMD == 256
#include <immintrin.h>
typedef __m256i vi_t;
typedef __m256 vf_t;
#define VL 8
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VBCAST32(p) _mm256_set1_epi32(load32(p))
#define VBCAST64(p) _mm256_set1_epi64x(load64(p))
#define VZERO() _mm256_setzero_si256()
#define VMASK4(v) _mm256_and_si256((v), _mm256_set1_epi8(0x0F))
#define VSHR4(v) _mm256_and_si256(_mm256_srli_epi16((v), 4), _mm256_set1_epi8(0x0F))
#define VUNPLO8(v) _mm256_unpacklo_epi8((v), _mm256_setzero_si256())
#define VUNPHI8(v) _mm256_unpackhi_epi8((v), _mm256_setzero_si256())
#define VSUB32(a, b) _mm256_sub_epi32((a), (b))
#define VADD32(a, b) _mm256_add_epi32((a), (b))
#define VMUL32(a, b) _mm256_mullo_epi32((a), (b))
#define VSET32(v) _mm256_set1_epi32(v)
#define VLOAD32(p) _mm256_loadu_si256((const __m256i *)(p))
#define VSLL4(a) _mm256_slli_epi32((a), 4)
#define VMADDUBS(a, b) _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), _mm256_set1_epi16(1))
#define VMADDWD(a, b) _mm256_madd_epi16((a), (b))
#define VSHUF(a, b, imm) _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), (imm)))
#define FZERO() _mm256_setzero_ps()
#define FLOAD(p) _mm256_loadu_ps(p)
#define FSTORE(p, v) _mm256_storeu_ps((p), (v))
#define FSET(v) _mm256_set1_ps(v)
#define FMUL(a, b) _mm256_mul_ps((a), (b))
#define FADD(a, b) _mm256_add_ps((a), (b))
#define FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define FCVT(a) _mm256_cvtepi32_ps(a)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DOT_VNNI 1
#define VDPBUSD(acc, u, x) _mm256_dpbusd_epi32((acc), (u), (x))
#define VDPWSSD(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#elif defined(__AVXVNNI__)
#define DOT_VNNI 1
#define VDPBUSD(acc, u, x) _mm256_dpbusd_avx_epi32((acc), (u), (x))
#define VDPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#endif
#endif

#if PANEL_SIMD
/* The panel vector of rows [r, r + VL) at channel k (panel_at), its stream prefetched ahead. */
static inline __attribute__((always_inline)) vi_t panel_load(const uint8_t *w, int64_t r, int64_t k, int64_t kp,
                                                             int nibbles) {
    const uint8_t *p = w + panel_at(r, k, kp, nibbles);
    PANEL_PREFETCH(p);
    return VLOAD(p);
}

/* int16 pairs: acc + a0 b0 + a1 b1 per int32 lane (vpdpwssd, or vpmaddwd + vpaddd: the same integers) */
#ifdef DOT_VNNI
#define DOT16(acc, a, b) VDPWSSD(acc, a, b)
#else
#define DOT16(acc, a, b) VADD32((acc), VMADDWD((a), (b)))
#endif
#endif
#endif
