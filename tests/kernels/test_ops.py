"""torch.ops.lowbit.linear: the prepared kernels bit for bit, eager and under torch.compile."""

import gc

import pytest
import torch

from lowbit.kernels import KernelError, from_float, prepare
from lowbit.kernels import ops

CASES = [("w4a16", torch.float32, 0), ("w4a16", torch.bfloat16, 0), ("w8a16", torch.float32, 0),
         ("w8a8", torch.float32, 0), ("w8a8", torch.bfloat16, 0), ("w4a4", torch.float32, 64),
         ("w4a4", torch.bfloat16, 64)]


class Holder:  # an owner for the handle's lifetime
    pass


@pytest.fixture(autouse=True)
def _graphs_compiled_here():
    """Every graph compiled in this process, none read from the machine's inductor cache: its key
    leaves out ATEN_CPU_CAPABILITY, and a graph cached under another capability gave NaN rows here.
    (The cross-process test below gives its processes a cache of their own.)"""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


@pytest.mark.parametrize("kind,dtype,k", CASES)
def test_op_equals_direct_call(kind, dtype, k):
    torch.manual_seed(0)
    p = from_float(torch.randn(70, 320), kind, n_outliers=k, bias=torch.randn(70))  # 70 rows: padded to 72
    pl = prepare(p)
    owner = Holder()
    h = ops.register(pl, owner)
    for shape in [(1, 320), (5, 320), (2, 3, 320), (0, 320)]:
        x = torch.randn(*shape).to(dtype)
        y = torch.ops.lowbit.linear(x, h)
        want = pl.batched(x)
        assert y.dtype == want.dtype == dtype and y.shape == want.shape
        assert torch.equal(y, want)
        assert y.is_contiguous()


@pytest.mark.parametrize("kind,dtype,k", [CASES[1], CASES[3], CASES[5]])
def test_op_under_torch_compile(kind, dtype, k):
    torch.manual_seed(1)
    pl = prepare(from_float(torch.randn(96, 256), kind, n_outliers=k))
    owner = Holder()
    h = ops.register(pl, owner)

    def f(x):
        return torch.relu(torch.ops.lowbit.linear(x * 2, h)) + 1

    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    for t in (3, 9):
        x = torch.randn(t, 256).to(dtype)
        assert torch.equal(compiled(x), f(x))


def test_op_applies_its_input_transform_first_eager_and_compiled():
    """``before`` (the plugin's reorder + block Hadamard of the -rot presets) runs inside the op."""
    from lowbit.kernels.cpu.hadamard import block_hadamard_reference

    torch.manual_seed(2)
    pl = prepare(from_float(torch.randn(48, 256), "w4a4", n_outliers=32))
    perm = torch.randperm(256)
    before = lambda x: block_hadamard_reference(x[..., perm], 224, 32)  # noqa: E731
    owner = Holder()
    h, plain = ops.register(pl, owner, before=before), ops.register(pl, owner)
    compiled = torch.compile(lambda x: torch.ops.lowbit.linear(x, h) + 1, fullgraph=True, backend="inductor")
    for t in (1, 6):
        x = torch.randn(t, 256)
        want = pl.batched(before(x))
        assert torch.equal(torch.ops.lowbit.linear(x, h), want) and torch.equal(ops.call(x, h), want)
        assert torch.equal(compiled(x), want + 1)
        assert not torch.equal(torch.ops.lowbit.linear(x, plain), want)
    with pytest.raises(TypeError, match="callable"):
        ops.register(pl, owner, before=3)


def test_fake_gives_shape_and_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode

    pl = prepare(from_float(torch.randn(40, 128), "w4a4", n_outliers=0))
    owner = Holder()
    h = ops.register(pl, owner)
    with FakeTensorMode():
        y = torch.ops.lowbit.linear(torch.empty(4, 7, 128, dtype=torch.bfloat16), h)
        assert y.shape == (4, 7, 40) and y.dtype == torch.bfloat16
        with pytest.raises(ValueError, match=r"\[\.\.\., 128\]"):
            torch.ops.lowbit.linear(torch.empty(4, 100), h)
    torch.library.opcheck(torch.ops.lowbit.linear.default, (torch.randn(3, 128), h))


def test_handle_released_with_owner_and_unknown_handle_is_clear():
    owner = Holder()
    h = ops.register(prepare(from_float(torch.randn(8, 64), "w8a8")), owner)
    assert ops.prepared(h).out_features == 8
    del owner
    gc.collect()
    with pytest.raises(KernelError, match=f"handle {h!r}"):
        torch.ops.lowbit.linear(torch.randn(1, 64), h)
    with pytest.raises(TypeError, match="PreparedLinear"):
        ops.register(object())


def test_call_is_the_op_in_eager_and_in_a_compiled_graph():
    """ops.call (what the vLLM plugin's layers run): the op's body directly in eager mode, the op
    itself while torch.compile traces, the same bits either way, the permutation included."""
    torch.manual_seed(2)
    pl = prepare(from_float(torch.randn(48, 192), "w4a4", n_outliers=16), input_perm=torch.randperm(192))
    owner = Holder()
    h = ops.register(pl, owner)
    x = torch.randn(5, 192).to(torch.bfloat16)
    want = torch.ops.lowbit.linear(x, h)
    assert torch.equal(ops.call(x, h), want) and torch.equal(want, pl.batched(x))
    compiled = torch.compile(lambda x: ops.call(x, h) * 1, fullgraph=True, backend="inductor")
    assert torch.equal(compiled(x), want)


@pytest.mark.parametrize("kind,dtype,k", [c for c in CASES if c[0] in ("w8a8", "w4a4")])
def test_non_finite_tokens_raise_or_give_nan_rows(kind, dtype, k):
    """An A8/A4 kernel has no code for NaN/Inf: an error for lowbit's own handles; NaN outputs for
    those tokens only with nan_rows (the plugin's, for vLLM's warm-up), the other tokens exactly
    what the kernel gives them with the bad tokens zeroed."""
    from lowbit.kernels.linear_params import NonFiniteActivations

    torch.manual_seed(1)
    pl = prepare(from_float(torch.randn(70, 320), kind, n_outliers=k, bias=torch.randn(70)))
    owner = Holder()
    strict, lenient = ops.register(pl, owner), ops.register(pl, owner, nan_rows=True)
    x = torch.randn(2, 3, 320).to(dtype)
    x[0, 1, 7], x[1, 2, 300] = float("nan"), float("inf")
    with pytest.raises(NonFiniteActivations, match="NaN or Inf"):
        ops.linear(x, strict)
    y = ops.linear(x, lenient)
    bad = torch.tensor([[False, True, False], [False, False, True]])
    assert y.shape == (2, 3, 70) and y.dtype == pl.batched(x[:1, :1].nan_to_num()).dtype
    assert y[bad].isnan().all()
    want = pl.batched(x.masked_fill(bad[..., None], 0))
    assert torch.equal(y[~bad], want[~bad])
    assert torch.equal(torch.ops.lowbit.linear(x, lenient)[~bad], want[~bad])  # the op's body: the same
    del owner
    gc.collect()
    with pytest.raises(KernelError):
        ops.linear(x, lenient)


_COMPILE_IN_A_FRESH_PROCESS = r"""
import sys
import torch
from lowbit.kernels import from_float, ops, prepare

out = int(sys.argv[1])
torch.manual_seed(out)
pl = prepare(from_float(torch.randn(out, 256), "w4a16"))
h = ops.register(pl)  # this process's first handle, as in the other process


def f(x):
    return torch.relu(torch.ops.lowbit.linear(x * 2, h)) + 1


x = torch.randn(3, 256).bfloat16()
y = torch.compile(f, fullgraph=True, backend="inductor")(x)
sys.exit(0 if y.shape == (3, out) and torch.equal(y, f(x)) else 1)
"""


def test_compiled_graphs_cached_on_disk_never_meet_another_processes_layer(tmp_path):
    """inductor's graph cache on disk is shared by processes and keyed by the graph's code, which
    holds the handle: two processes whose first handles stand for layers of different sizes must
    each get their own graph (before handles named the sizes, the second got the first's buffers:
    NaN or wrong rows)."""
    import os
    import subprocess
    import sys

    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    for out in (96, 70):
        r = subprocess.run([sys.executable, "-c", _COMPILE_IN_A_FRESH_PROCESS, str(out)], env=env, timeout=300,
                           capture_output=True, text=True)
        assert r.returncode == 0, (out, r.stderr[-2000:])
