"""`PYTHONPATH=. python scripts/decode_merge_ab.py`. Side by side, interleaved: the one-shot local step as decode-to-float32 + merge (before) and the
fused per-row decode_merge (now), 16 M bf16 values, one thread."""
import statistics, time, torch
from lowbit.comm.channels import ChannelPlan, spread_channels
from lowbit.comm.codecs import decode, encode, parse_spec
torch.set_num_threads(1)
hidden = 576
x = torch.randn((16 << 20) // hidden * hidden).bfloat16().view(-1, hidden)
for spec in ("int4+o16", "int4+h", "int4+h+o16", "int3+h+o16"):
    s = parse_spec(spec)
    plan = ChannelPlan.make(s, hidden, spread_channels(s.outliers, hidden) if s.outliers else None)
    wire = encode(x.float().view(-1), s.codec)
    outl = torch.empty(x.shape[0], s.outliers, dtype=x.dtype)
    plan.encode(x, s.codec, wire, outl)
    osum, out, dec = outl.float(), torch.empty_like(x), torch.empty(x.numel())
    before = lambda: plan.merge(decode(wire, s.codec, x.numel(), torch.float32, out=dec).view(-1, hidden), osum, out)
    now = lambda: plan.decode_merge([wire], s.codec, osum, out)
    ts = {"before": [], "now": []}
    for _ in range(7):
        for k, f in (("before", before), ("now", now)):
            t0 = time.perf_counter(); f(); ts[k].append(time.perf_counter() - t0)
    b, n = statistics.median(ts["before"]), statistics.median(ts["now"])
    print(f"{spec}: decode+merge {b*1e3:.1f} ms -> fused {n*1e3:.1f} ms ({b/n:.2f}x)")
