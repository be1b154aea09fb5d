"""The native build cache loads only what this user built: planted, corrupted or unrecorded
libraries are rebuilt, unsafe cache directories are refused, normal use still caches."""

import os
import shutil
import subprocess

import pytest

from lowbit.native import cbuild, cache as native_cache

pytestmark = pytest.mark.skipif(cbuild.compiler() is None, reason="no C compiler")

GOOD = "int answer(void) { return 42; }\n"
# a planted library: its constructor leaves a marker file the moment anything loads it
EVIL = """#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("LOWBIT_TEST_MARKER"), "w");
    if (f) fclose(f);
}
int answer(void) { return 666; }
"""


@pytest.fixture
def setup(tmp_path, monkeypatch):
    src = tmp_path / "src" / "probe.c"
    src.parent.mkdir()
    src.write_text(GOOD)
    marker = tmp_path / "planted-ran"
    monkeypatch.setenv("LOWBIT_TEST_MARKER", str(marker))
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))
    return src, marker, tmp_path


def _evil_so(tmp_path):
    c = tmp_path / "evil.c"
    c.write_text(EVIL)
    so = tmp_path / "evil.so"
    subprocess.run([cbuild.compiler(), "-shared", "-fPIC", str(c), "-o", str(so)], check=True)
    return so


def _built_name(src, tmp_path, monkeypatch):
    """The cached file name of ``src``'s build (built once in a scratch cache)."""
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "scratch"))
    assert cbuild.compile_library(src, ("-O1",)).answer() == 42
    (so,) = (tmp_path / "scratch" / "native").glob("probe_*.so")
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))
    return so.name


def test_normal_use_caches_and_records_the_hash(setup, monkeypatch):
    src, _, tmp_path = setup
    assert cbuild.compile_library(src, ("-O2",)).answer() == 42
    d = tmp_path / "cache" / "native"
    (so,) = d.glob("probe_*.so")
    assert native_cache.record_path(so).read_text().strip() == native_cache.sha256_file(so)
    assert not [p for p in d.iterdir() if p.name.startswith(".tmp-")]  # no temp files left behind
    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    assert cbuild.compile_library(src, ("-O2",)).answer() == 42
    assert calls == []  # served from the cache, no compiler run


@pytest.mark.parametrize("record", ["missing", "wrong"])
def test_planted_library_is_rebuilt_never_loaded(setup, monkeypatch, record):
    src, marker, tmp_path = setup
    name = _built_name(src, tmp_path, monkeypatch)
    d = tmp_path / "cache" / "native"
    d.mkdir(parents=True, mode=0o700)
    planted = d / name
    shutil.copy(_evil_so(tmp_path), planted)
    if record == "wrong":
        native_cache.record_path(planted).write_text("0" * 64 + "\n")
    lib = cbuild.compile_library(src, ("-O1",))
    assert lib.answer() == 42
    assert not marker.exists(), "the planted library's constructor ran"
    assert native_cache.verified(planted)


def test_world_writable_cache_dir_is_refused(setup, monkeypatch):
    src, marker, tmp_path = setup
    name = _built_name(src, tmp_path, monkeypatch)
    d = tmp_path / "cache" / "native"
    d.mkdir(parents=True)
    os.chmod(d, 0o777)
    planted = d / name
    shutil.copy(_evil_so(tmp_path), planted)
    native_cache.record_path(planted).write_text(native_cache.sha256_file(planted) + "\n")  # even a matching record
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        lib = cbuild.compile_library(src, ("-O1",))
    assert lib.answer() == 42
    assert not marker.exists(), "a library from a world-writable directory was loaded"
    assert native_cache.private_dir() != d and list(native_cache.private_dir().glob("probe_*.so"))


def test_cache_dir_of_another_user_is_refused(setup, monkeypatch):
    src, _, tmp_path = setup
    (tmp_path / "cache" / "native").mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 12345)
    with pytest.warns(RuntimeWarning, match="not by this user"):
        assert cbuild.compile_library(src, ("-O1",)).answer() == 42
    assert not list((tmp_path / "cache" / "native").glob("probe_*.so"))


def test_a_change_in_a_shared_header_rebuilds(setup, monkeypatch):
    """Headers in lowbit/native/csrc (included by several libraries) are part of every library's
    cache key: editing one must not leave a stale build in use."""
    src, _, tmp_path = setup
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "answer.h").write_text("#define ANSWER 42\n")
    src.write_text('#include "../shared/answer.h"\nint answer(void) { return ANSWER; }\n')
    monkeypatch.setattr(cbuild, "SHARED_CSRC", shared)
    assert cbuild.compile_library(src, ("-O1",)).answer() == 42
    (shared / "answer.h").write_text("#define ANSWER 43\n")
    assert cbuild.compile_library(src, ("-O1",)).answer() == 43
    assert len(list((tmp_path / "cache" / "native").glob("probe_*.so"))) == 2
