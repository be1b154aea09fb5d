"""ISA variants of every native library: all compile on any x86-64 machine; each one this CPU runs
gives the portable build's bits; the selection follows the CPU and LOWBIT_ISA, and forcing a
variant the CPU lacks is an error (never an illegal instruction)."""

import pytest
import torch

from lowbit.comm.codecs import native as codecs_native
from lowbit.native import cbuild, isa
from lowbit.kernels.cpu import a16_gemm, decode_ops, hadamard, i8_gemm, kv_packed, w4_gemv, w4a4, w8_gemv, w8a8
from lowbit.kernels import from_float
from lowbit.native.isa import ISAError
from lowbit.quantize.outliers import outlier_permutation
from tests.kernels.cpu.builds import bf16_edge_values, variant_flags as _flags

SOURCES = {"w4": w4_gemv._LIB.src, "w8": w8_gemv._LIB.src, "i8_gemm": i8_gemm._LIB.src, "a16_gemm": a16_gemm._LIB.src,
           "decode_ops": decode_ops._LIB.src, "kv_packed": kv_packed._LIB.src, "hadamard": hadamard._LIB.src,
           "codecs": codecs_native._SRC}
X86 = pytest.mark.skipif(not isa.x86(), reason="ISA variants are x86-64 target flags")


@X86
@pytest.mark.parametrize("variant", isa.VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("source", SOURCES, ids=str)
def test_every_variant_compiles_here(source, variant, tmp_path):
    """Compile-only (the instructions need not run here): a variant that stops compiling fails on any
    machine. At -O0, a quarter of -O3's time: a target-flag or intrinsic mismatch (an always_inline
    intrinsic outside its target) fails at every level, and the variants this CPU runs are built at
    -O3 by the tests below."""
    import subprocess

    cc = cbuild.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    r = subprocess.run([cc, *_flags(variant, opt="-O0"), "-Werror=implicit-function-declaration", "-shared", "-fPIC",
                        str(SOURCES[source]), "-o", str(tmp_path / "x.so"), "-lm"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _w4_outputs(lib):
    torch.manual_seed(0)
    p = from_float(torch.randn(72, 320), "w4a16", group=64)
    w = w4_gemv.prepare(p)
    x = torch.randn(5, 320) * 3
    pa = from_float(torch.randn(72, 320), "w4a4", group=64, act_clip=0.9)
    wa = w4_gemv.prepare(pa, kinds=("w4a4",))
    y_a4, _ = w4_gemv.quantize_and_run(x, wa, 0, 4, 0.9, lib=lib)
    return [w4_gemv.run(x, w, lib), w4_gemv.run(x.bfloat16(), w, lib), y_a4]


def _w8_outputs(lib):
    torch.manual_seed(1)
    p = from_float(torch.randn(36, 300), "w8a16")
    w = w8_gemv.prepare(p.codes, p.scale[:, 0])
    x = torch.randn(6, 300) * 2
    return [w8_gemv.run(x, w, lib), w8_gemv.quantize_and_run(x, w, 8, 1.0, lib=lib)]


def _i8_outputs(lib):
    """W4A4 (INT4 panels, INT8 outliers fused) and W8A8 (INT8 panels) over tails of the token and row
    tiles; each variant's dot product (vpdpbusd, vpmaddubsw, nibble-split, AMX tiles) gives the same
    integers."""
    torch.manual_seed(4)
    out = []
    p4 = from_float(torch.randn(50, 333), "w4a4", group=64, n_outliers=13, act_clip=0.9)
    p8 = from_float(torch.randn(50, 301), "w8a8")
    w4, w8 = w4a4.prepare(p4, "gemm"), w8a8.prepare(p8, "gemm")
    perm = torch.randperm(333)
    atom = outlier_permutation(torch.rand(333), 13)  # a rising head of 320 channels: each build's compresses
    for t in (1, 7, 13, 50):  # 50: AMX tiles for both where the build has them
        x = torch.randn(t, 333) * 3
        out.append(i8_gemm.run_codes(i8_gemm.act_codes(x, 13, w4.normal, 4, 0.9, lib), w4.normal, w4.outlier, lib))
        c = i8_gemm.act_codes(x[:, :301] * 9, 0, w8.weight, 8, 1.0, lib)
        out.append(i8_gemm.run_codes(c, w8.weight, lib=lib))
        xb = x.bfloat16()  # one call to bfloat16 output: the rounding in the vector width of each build
        out.append(i8_gemm.linear(xb, w4.args, 50, keep_bf16=True, lib=lib))
        out.append(i8_gemm.linear(xb[:, :301], w8.args, 50, keep_bf16=True, lib=lib))
        # read through a permutation: each build's gathers (16 / 8 lanes, the last token's row alone)
        out.append(i8_gemm.linear(xb, w4.args, 50, perm, keep_bf16=True, lib=lib))
        out.append(i8_gemm.linear(x, w4.args, 50, perm, lib=lib))
        out.append(i8_gemm.linear(xb, w4.args, 50, atom, keep_bf16=True, lib=lib))
        out.append(i8_gemm.linear(x, w4.args, 50, atom, lib=lib))
    out.append(i8_gemm.round_bf16(bf16_edge_values(), lib).view(torch.int16))  # NaN bits compared too
    return out


def _a16_outputs(lib):
    """W4A16 (zero points, groups of 64) and W8A16 over tails of the token and row tiles (140 rows: a
    work item of few tokens is 128 rows, then 12 past a whole vector), few tokens and many (70: the
    widened weights), float32 in, and bfloat16 for few tokens; each variant's int16 dot product (vpdpwssd,
    vpmaddwd) gives the same integers."""
    torch.manual_seed(5)
    from tests.kernels.cpu.test_a16_gemm import _asymmetric

    w4 = a16_gemm.prepare_w4(_asymmetric(140, 333, 64, seed=5))
    p8 = from_float(torch.randn(140, 301), "w8a16")
    w8 = a16_gemm.prepare_w8(p8.codes, p8.scale[:, 0])
    out = []
    for t in (1, 2, 6, 13, 70):
        x = torch.randn(t, 333) * torch.linspace(0.1, 5, 333)
        out += [a16_gemm.run(x, w4, lib), a16_gemm.run(x[:, :301], w8, lib)]
        if t < 32:  # more bfloat16 tokens take the bf16 products on AVX512_BF16 builds
            out.append(a16_gemm.run(x.bfloat16(), w4, lib))
    return out


def _decode_outputs(lib):
    """RMSNorm and rotary: the same bits in every build (the attention is within its float32
    bound instead, checked for each variant below)."""
    torch.manual_seed(2)
    x, w = torch.randn(3, 64), torch.randn(64)
    xr, cos, sin = torch.randn(2, 3, 4, 16), torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    with torch.no_grad():
        return [decode_ops.rms_norm(x, w, 1e-5, lib=lib), decode_ops.rms_norm(x.bfloat16(), w.bfloat16(), 1e-5, lib=lib),
                decode_ops.rope(xr, cos, sin, lib=lib), decode_ops.rope(xr.bfloat16(), cos.bfloat16(), sin.bfloat16(), lib=lib)]


def _kv_packed_outputs(lib):
    """The packed KV cache's row quantizer and a prefill's append-and-read-back (rotated, 4 and 8
    bits): the same bits in every build."""
    from lowbit.nn.kv_cache import PackedKV

    g = torch.Generator().manual_seed(2)
    rows = torch.randn(40, 32, generator=g) * torch.logspace(-6, 3, 40)[:, None]
    out = [*kv_packed.kv_quant_rows(rows, 4, lib=lib), *kv_packed.kv_quant_rows(rows, 8, lib=lib)]
    for bits, dtype in ((4, torch.bfloat16), (8, torch.float32)):
        x = (torch.randn(2, 3, 70, 64, generator=g) * 3).to(dtype)
        side = PackedKV(bits, False, True)
        side.head_dim = 64
        bufs = side.reserve((2, 3), 70)
        out += [kv_packed.kv_append_read(x, bufs, 0, bits, 64, True, dtype, lib=lib), *(b[:, :, :70] for b in bufs)]
    return out


def _hadamard_outputs(lib):
    torch.manual_seed(6)
    x = torch.randn(5, 576) * 4
    return [hadamard.block_hadamard(x, 512, 128, lib=lib), hadamard.block_hadamard(x.bfloat16(), 576, 64, lib=lib),
            hadamard.block_hadamard(x[:, :40], 32, 4, lib=lib), hadamard.input_hadamard(x, lib=lib),
            hadamard.input_hadamard(torch.randn(3, 1536).bfloat16(), lib=lib),
            hadamard.block_hadamard(torch.randn(64, 1536).bfloat16(), 1472, 64, lib=lib, perm=torch.randperm(1536))]


def _codec_outputs(lib):
    from lowbit.comm.codecs import get_codec
    from lowbit.comm.codecs.fast import _kind

    torch.manual_seed(3)
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = (torch.randn(3 * 2048 + 77) * 5).to(dtype)
        rows = -(-x.numel() // 2048)
        for name in ("int8", "int6", "int4", "int3", "fp4"):
            c = get_codec(name)
            rb, cb, k = c.wire_row_bytes(dtype), c.wire_code_bytes(dtype), _kind(c, dtype)
            wire = codecs_native.encode_rows(x, k, c.bits, rows, rb, cb, lib=lib)
            out += [wire, codecs_native.decode_rows(wire, k, c.bits, rb, cb, x.numel(), torch.float32, lib=lib)]
    return out + _channel_outputs(lib)


def _channel_outputs(lib):
    """The channel options' fused rows (encode + split, decode + sum + merge) over full rows and a
    partial one, with NaN, blocks beyond fp16 (extended scales) and tiny values (subnormal fp16
    scales, the smallest decoded sums: the AVX512_BF16 cast's no-subnormal argument), 1-3 wires;
    every encode once with the AVX-512 integer codes by the reciprocal and once by the divide."""
    try:
        return [t for divide in (False, True) for t in _channel_outputs_with(lib, divide)]
    finally:
        codecs_native.set_divide_codes(codecs_native.divide_codes(), lib)


def _channel_outputs_with(lib, divide: bool):
    from lowbit.comm.channels import ChannelPlan
    from lowbit.comm.codecs import get_codec, parse_spec

    codecs_native.set_divide_codes(divide, lib)
    g = torch.Generator().manual_seed(4)
    out = []
    for spec, n in (("int4+o16", 16), ("int4+h", 0), ("int4+h+o6", 6), ("int4+h32+o5", 5), ("int3+h+o3", 3),
                    ("fp4+o4", 4)):
        plan = ChannelPlan.make(spec, 576, torch.randperm(576, generator=g)[:n].sort().values if n else None)
        c = get_codec(parse_spec(spec).codec.name)
        kind = 0 if c.kind == "int" else 1
        tokens = 9  # 5184 values: two full rows and a partial one
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            wires = []
            for w in range(3):
                x = torch.randn(tokens, 576, generator=g) * torch.rand(576, generator=g) * 50
                x[1, :200] *= 1e-6
                x[2, 64:128] *= 1e-9
                x[3, 7] = float("nan")
                if dtype != torch.float16:
                    x[4, 100:300] *= 1e33
                x = x.to(dtype)
                wire = torch.empty(-(-x.numel() // 2048), c.row_bytes, dtype=torch.uint8)
                outl = torch.empty(tokens, n, dtype=dtype)
                codecs_native.encode_split(x, 576, plan.channels, n, plan.block, plan.scale, kind, c.bits, c.row_bytes,
                                           c.code_bytes, wire, outl, lib=lib)
                wires.append(wire)
                out += [wire, outl]
            osum = torch.randn(tokens, n, generator=g) * 1e3
            for nw in (1, 3):
                got = codecs_native.decode_merge_channels(wires[:nw], kind, c.bits, c.row_bytes, c.code_bytes, 576,
                                                          plan.channels, n, plan.block, plan.scale, osum if n else None,
                                                          torch.empty(tokens * 576, dtype=dtype), lib=lib)
                out.append(got.view(torch.uint8))
    return out


OUTPUTS = {"w4": (_w4_outputs, w4_gemv.library, w4_gemv.PORTABLE_FLAGS),
           "w8": (_w8_outputs, w8_gemv.library, w8_gemv.PORTABLE_FLAGS),
           "i8_gemm": (_i8_outputs, i8_gemm.library, i8_gemm.PORTABLE_FLAGS),
           "a16_gemm": (_a16_outputs, a16_gemm.library, a16_gemm.PORTABLE_FLAGS),
           "decode_ops": (_decode_outputs, decode_ops.library, ("-O3",)),
           "kv_packed": (_kv_packed_outputs, kv_packed.library, ("-O3",)),
           "hadamard": (_hadamard_outputs, hadamard.library, ("-O3",)),
           "codecs": (_codec_outputs, codecs_native.variant, codecs_native.PORTABLE_FLAGS)}


@X86
@pytest.mark.parametrize("variant", [v for v in isa.VARIANTS if v.needs], ids=lambda v: v.name)
@pytest.mark.parametrize("source", OUTPUTS, ids=str)
def test_each_runnable_variant_equals_portable(source, variant):
    if not isa.runnable(variant):
        pytest.skip(f"this CPU lacks {', '.join(isa.missing(variant))} for {variant.name}")
    outputs, library, portable_flags = OUTPUTS[source]
    lib, portable = library(_flags(variant)), library(portable_flags)
    if lib is None or portable is None:
        pytest.skip("no C compiler")
    for got, want in zip(outputs(lib), outputs(portable)):
        assert got is not None and want is not None
        assert torch.equal(got, want), variant.name


def test_selection_follows_features_and_override(monkeypatch):
    none = {f: False for v in isa.VARIANTS for f in v.needs}
    avx2 = none | {"avx2": True, "fma": True, "f16c": True}
    vnni = avx2 | {"avx512f": True, "avx512bw": True, "avx512vl": True, "avx512_vnni": True}
    monkeypatch.delenv("LOWBIT_ISA", raising=False)
    if isa.x86():
        assert isa.selected(none).name == "portable"
        assert isa.selected(avx2).name == "avx2"
        assert isa.selected(avx2 | {"avx_vnni": True}).name == "avxvnni"
        assert isa.selected(vnni).name == "avx512vnni"
        monkeypatch.setenv("LOWBIT_ISA", "avx2")
        assert isa.selected(vnni).name == "avx2"
        monkeypatch.setenv("LOWBIT_ISA", "avx512bf16")
        with pytest.raises(ISAError, match="lacks avx512_bf16"):
            isa.selected(vnni)
    monkeypatch.setenv("LOWBIT_ISA", "sse9")
    with pytest.raises(ISAError, match="not a variant"):
        isa.selected(avx2)


def test_flag_sets_fall_back_to_portable_and_name_their_variant(monkeypatch):
    monkeypatch.delenv("LOWBIT_ISA", raising=False)
    sets = isa.flag_sets(("-pthread",))
    assert isa.variant_of(sets[0]) == isa.selected().name and isa.variant_of(sets[-1]) == "portable"
    assert all(isa.runnable(isa.BY_NAME[isa.variant_of(f)]) for f in sets)


@X86
@pytest.mark.parametrize("variant", [v for v in isa.VARIANTS if v.needs], ids=lambda v: v.name)
def test_each_runnable_variant_attention_within_bound(variant):
    from tests.kernels.cpu.test_decode_ops import _attention_bound, _qkv

    if not isa.runnable(variant):
        pytest.skip(f"this CPU lacks {', '.join(isa.missing(variant))} for {variant.name}")
    lib = decode_ops.library(_flags(variant))
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = _qkv(2, 6, 3, 70, 64, dtype, seed=7)
        with torch.no_grad():
            out = decode_ops.attention_decode(q, k, v, 0.125, lib=lib)
        ref, bound = _attention_bound(q, k, v, 0.125, dtype)
        assert torch.all((out.double() - ref).abs() <= bound), (variant.name, dtype)


@X86
@pytest.mark.parametrize("variant", [v for v in isa.VARIANTS if v.needs], ids=lambda v: v.name)
def test_each_runnable_variant_packed_attention_within_bound(variant):
    """Decode attention from a packed KV cache's codes (SIMD rows and scalar ones) in every build
    this CPU runs: float64 attention over the dequantized cache within float32 rounding."""
    from lowbit.nn.kv_cache import PackedKV

    if not isa.runnable(variant):
        pytest.skip(f"this CPU lacks {', '.join(isa.missing(variant))} for {variant.name}")
    lib = kv_packed.library(_flags(variant))
    torch.manual_seed(8)
    for bits, group in ((4, 64), (8, 16), (4, 8)):
        k, v = PackedKV(bits, False, group=group), PackedKV(bits, False, group=group)
        k.append(torch.randn(2, 2, 33, 64) * 3), v.append(torch.randn(2, 2, 33, 64))
        q = torch.randn(2, 6, 1, 64)
        out = kv_packed.attention_decode_packed(q, k.codes, k.scale, k.zero, v.codes, v.scale, v.zero, bits, group, 0.125,
                                                 lib=lib)
        ref = decode_ops.attention_decode_reference(q.double(), k.dequantize(torch.float32).double(),
                                                    v.dequantize(torch.float32).double(), 0.125)
        torch.testing.assert_close(out.double(), ref[:, 0], rtol=2e-5, atol=2e-5, msg=f"{variant.name} {bits}-bit g{group}")


@X86
@pytest.mark.parametrize("variant", [v for v in isa.VARIANTS if v.needs], ids=lambda v: v.name)
def test_each_runnable_variant_decode_step_writes_the_portable_codes(variant):
    """The one-call decode step over a packed KV cache in every build this CPU runs: the new rows
    (rotated by the butterfly, then quantized) are the portable build's bits; the attention is
    within float32 rounding of it (each within 2e-5 of float64: test_packed_attention_...)."""
    from lowbit.nn.kv_cache import PackedKV

    if not isa.runnable(variant):
        pytest.skip(f"this CPU lacks {', '.join(isa.missing(variant))} for {variant.name}")
    torch.manual_seed(9)
    q, k, v = torch.randn(2, 6, 1, 64), torch.randn(2, 2, 1, 64) * 3, torch.randn(2, 2, 1, 64)
    for rotate in (False, True):
        runs = []
        for lib in (kv_packed.library(("-O3",)), kv_packed.library(_flags(variant))):
            sides = [PackedKV(4, False), PackedKV(4, False)]
            for side, x in zip(sides, (torch.randn(2, 2, 33, 64, generator=torch.Generator().manual_seed(1)),) * 2):
                side.append(x)
                side.reserve((2, 2), 1)
            out = kv_packed.kv_decode_step(q, k, v, sides[0]._bufs, sides[1]._bufs, 33, 4, 64, rotate, 0.125, lib=lib)
            runs.append((out, [t[:, :, 33].clone() for s in sides for t in s._bufs]))
        (want, rows_want), (got, rows_got) = runs
        assert all(torch.equal(a, b) for a, b in zip(rows_want, rows_got)), (variant.name, rotate)
        torch.testing.assert_close(got, want, rtol=4e-5, atol=4e-5, msg=f"{variant.name} rotate={rotate}")
