/* IEEE half-precision bits <-> the compiler's _Float16 (conversions from float round to nearest
 * even, as torch's .to(float16); F16C instructions where the build has them), shared by the
 * all-reduce codecs (comm/codecs/csrc/qr_codec.c) and the packed KV cache (kernels/csrc/decode_ops.c). */
#ifndef LOWBIT_HALF_H
#define LOWBIT_HALF_H
#include <stdint.h>
#include <string.h>

static inline uint16_t h_bits(_Float16 h) { uint16_t b; memcpy(&b, &h, 2); return b; }
static inline _Float16 h_from(uint16_t b) { _Float16 h; memcpy(&h, &b, 2); return h; }

#endif
