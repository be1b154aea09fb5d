"""A built wheel carries the C sources: installed away from the source tree (no editable path,
a fresh build cache), every native library builds and runs, so no kernel silently falls back."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = r'''
import itertools, sys, torch
import lowbit
assert lowbit.__file__.startswith(sys.argv[1]), lowbit.__file__
from lowbit.comm.codecs import native as codecs_native
from lowbit.kernels import from_float, prepare, reference
from lowbit.kernels.cpu import a16_gemm, decode_ops, hadamard, i8_gemm, kv_packed, w4_gemv, w8_gemv
built = {"codecs": codecs_native.available(), "w4": w4_gemv.available(), "w8": w8_gemv.available(),
         "decode_ops": decode_ops.library() is not None, "i8_gemm": i8_gemm.available(),
         "a16_gemm": a16_gemm.available(), "hadamard": hadamard.library() is not None,
         "kv_packed": kv_packed.library() is not None}
assert all(built.values()), built
torch.manual_seed(0)
x = torch.randn(3, 256)
for kind, method in itertools.product(("w4a16", "w8a16", "w8a8", "w4a4"), ("native", "gemm")):
    p = from_float(torch.randn(64, 256), kind, group=128)
    lin = prepare(p, cpu_method=method)
    assert lin.kernel == f"cpu:{method}", (kind, lin.kernel)
    y, ref = lin(x), reference.linear(x, p)
    assert torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max())), kind
print("native kernels ok:", sorted(built))
'''


@pytest.mark.slow
def test_wheel_ships_and_builds_every_native_kernel(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "lowbit", src / "lowbit", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    wheel = next((tmp_path / "dist").glob("lowbit-*.whl"))
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                        "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {**os.environ, "PYTHONPATH": str(site), "LOWBIT_CACHE": str(tmp_path / "cache")}
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    r = subprocess.run([sys.executable, "-c", CHECK, str(site)], capture_output=True, text=True, timeout=600,
                       cwd=run_dir, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "native kernels ok" in r.stdout
