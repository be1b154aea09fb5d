"""Prepared weights moved into 2 MiB pages: the same bits from every kernel kind, memory that
outlives the arena's later mappings, and the switch and the kernel's THP mode honoured."""

from __future__ import annotations

import copy
import gc
import io
import mmap

import pytest
import torch

from lowbit.kernels.cpu import huge_pages
from lowbit.kernels.dispatch import prepare
from lowbit.kernels.linear_params import from_float

# gated on the machine, not on enabled(): a broken enabled() must fail here, not skip
needs_thp = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or huge_pages.thp_mode() not in ("always", "madvise"),
                               reason=f"transparent huge pages here: {huge_pages.thp_mode()}")


def _mapping_flags(addr: int) -> list[str]:
    """VmFlags of the mapping of this process that holds ``addr`` (``hg``: MADV_HUGEPAGE)."""
    lines = open("/proc/self/smaps").read().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


@needs_thp
def test_relocated_tensor_keeps_its_values_in_an_advised_mapping():
    t = torch.randn(300, 97)
    r = huge_pages.relocate_tensor(t)
    assert r.data_ptr() != t.data_ptr() and torch.equal(r, t) and r.dtype == t.dtype and r.shape == t.shape
    assert r.data_ptr() % huge_pages.ALIGN == 0
    assert "hg" in _mapping_flags(r.data_ptr()) and "hg" not in _mapping_flags(t.data_ptr())
    buf = io.BytesIO()
    torch.save(r, buf)  # its own bytes, not the 32 MiB mapping around them
    assert len(buf.getvalue()) < t.nbytes + 4096


@needs_thp
def test_enabled_where_the_kernel_gives_huge_pages(monkeypatch):
    for flag in ("1", ""):  # unset or empty: the default, on
        monkeypatch.setenv("LOWBIT_HUGE_PAGES", flag)
        assert huge_pages.enabled()


@needs_thp
def test_mappings_are_2mib_aligned_and_tensors_64_byte_aligned():
    arena = huge_pages._Arena()  # a fresh one: its first mapping starts here
    first = arena.take(1000)
    second = arena.take(huge_pages.MIN_BYTES + 3)
    own = arena.take(huge_pages.CHUNK // 2)  # too large to share: a mapping of its own
    assert first.data_ptr() % huge_pages.PAGE == 0 and own.data_ptr() % huge_pages.PAGE == 0
    assert second.data_ptr() - first.data_ptr() == 1024 and second.data_ptr() % huge_pages.ALIGN == 0
    assert "hg" in _mapping_flags(first.data_ptr()) and "hg" in _mapping_flags(own.data_ptr())


@needs_thp
def test_a_mapping_goes_when_its_last_tensor_does():
    arena = huge_pages._Arena()
    t = arena.take(4096)
    held = arena.map
    assert held() is not None
    del t
    gc.collect()
    assert held() is None  # the arena's own reference does not keep freed weights resident


@needs_thp
def test_small_odd_or_foreign_tensors_stay_where_they_are():
    for t in (torch.zeros(10), torch.zeros(64, 64).t(), torch.zeros(8192, requires_grad=True)):
        assert huge_pages.relocate_tensor(t) is t


@needs_thp
def test_memory_outlives_later_mappings_and_collection():
    first = huge_pages.relocate_tensor(torch.arange(100_000, dtype=torch.int32))
    for _ in range(3):  # fill the arena's mapping and start new ones
        huge_pages.relocate_tensor(torch.ones(huge_pages.CHUNK // 4 // 4, dtype=torch.int32))
    big = huge_pages.relocate_tensor(torch.ones(huge_pages.CHUNK // 2, dtype=torch.uint8))  # a mapping of its own
    gc.collect()
    assert torch.equal(first, torch.arange(100_000, dtype=torch.int32)) and int(big.sum()) == huge_pages.CHUNK // 2


@needs_thp
@pytest.mark.parametrize("kind,tokens", [("w4a16", 1), ("w4a16", 40), ("w8a16", 1), ("w8a16", 40), ("w8a8", 1),
                                         ("w8a8", 40), ("w4a4", 1), ("w4a4", 40)])
def test_every_kind_gives_the_same_bits_from_huge_pages(kind, tokens, monkeypatch):
    torch.manual_seed(0)
    w = torch.randn(200, 256) / 16
    p = from_float(w, kind, group=128, **({"n_outliers": 32} if kind == "w4a4" else {}))
    x = torch.randn(tokens, 256).bfloat16()
    monkeypatch.setenv("LOWBIT_HUGE_PAGES", "0")
    plain = prepare(p, "cpu")
    monkeypatch.setenv("LOWBIT_HUGE_PAGES", "1")
    moved = prepare(p, "cpu", input_perm=None)
    assert plain.kernel == moved.kernel
    ptrs = [t.data_ptr() for t in _tensors(moved.state) if t.nbytes >= huge_pages.MIN_BYTES]
    assert ptrs and all("hg" in _mapping_flags(a) for a in ptrs)  # the weights moved
    cached = {a for st in _states(moved.state) for a in (getattr(st, "args", None) or ()) if isinstance(a, int)}
    if cached:  # raw pointers cached at construction point at the moved memory, not the freed one
        assert set(ptrs) <= cached
    gc.collect()
    assert torch.equal(plain.batched(x), moved.batched(x))


@needs_thp
@pytest.mark.parametrize("kind,method", [("w4a16", "native"), ("w4a16", "int4pack"), ("w8a16", "native"),
                                         ("w8a16", "int8pack"), ("w8a8", "int_mm"), ("w8a8", "float"),
                                         ("w4a4", "native"), ("w4a4", "float")])
def test_other_methods_and_copies_of_moved_weights_give_the_same_bits(kind, method, monkeypatch):
    from lowbit.kernels.linear_params import KernelError

    torch.manual_seed(1)
    p = from_float(torch.randn(96, 256) / 16, kind, group=128, **({"n_outliers": 32} if kind == "w4a4" else {}))
    x = torch.randn(3, 256).bfloat16()
    monkeypatch.setenv("LOWBIT_HUGE_PAGES", "0")
    try:
        want = prepare(p, "cpu", cpu_method=method).batched(x)
    except KernelError as e:  # a method this CPU or torch build refuses
        pytest.skip(str(e))
    monkeypatch.setenv("LOWBIT_HUGE_PAGES", "1")
    moved = prepare(p, "cpu", cpu_method=method)
    buf = io.BytesIO()
    torch.save(moved, buf)
    twin = copy.deepcopy(moved)
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    del moved
    gc.collect()
    for pl in (twin, loaded):
        assert torch.equal(pl.batched(x), want)


def _states(v):
    import dataclasses

    if dataclasses.is_dataclass(v):
        yield v
        for f in dataclasses.fields(v):
            yield from _states(getattr(v, f.name))


def _tensors(v):
    return [t for st in _states(v) for t in vars(st).values() if isinstance(t, torch.Tensor)]


def test_switch_and_thp_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("LOWBIT_HUGE_PAGES", "2")
    with pytest.raises(ValueError, match="LOWBIT_HUGE_PAGES"):
        huge_pages.enabled()
    monkeypatch.setenv("LOWBIT_HUGE_PAGES", "0")
    state = prepare(from_float(torch.randn(64, 128), "w8a8"), "cpu").state
    assert huge_pages.relocate(state) is state
    monkeypatch.setenv("LOWBIT_HUGE_PAGES", "1")
    f = tmp_path / "enabled"
    monkeypatch.setattr(huge_pages, "_THP", f)
    assert huge_pages.thp_mode() == "unavailable" and not huge_pages.enabled()
    f.write_text("always madvise [never]\n")
    assert huge_pages.thp_mode() == "never" and not huge_pages.enabled()
    for mode in ("always", "madvise"):
        f.write_text({"always": "[always] madvise never\n", "madvise": "always [madvise] never\n"}[mode])
        assert huge_pages.thp_mode() == mode and huge_pages.enabled() == hasattr(mmap, "MADV_HUGEPAGE")
