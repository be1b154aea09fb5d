"""The house rules as a test: which folder of lowbit may import which (every import, those inside
functions included), no cycle between sibling folders, small files, no folder over a fifth of
the code. An upward import fails here with the line that made it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lowbit"

# Floors from the ground up. A module may import its own folder and any lower floor; folders on
# one floor are independent of each other.
LAYERS = [
    {"errors"},
    {"formats", "native", "io"},  # pure math and data; the C build; files
    {"data", "kernels", "comm"},  # datasets; kernel backends; the all-reduce
    {"nn"},  # torch modules holding packed weights
    {"models"},  # float models, architecture adapters, shard plan
    {"quantize", "accelerate"},  # the quantizer; model surgery putting kernels into a model
    {"checkpoint"},  # saving and opening checkpoints (lowbit's own, compressed-tensors)
    {"parallel", "export", "vllm_plugin"},  # tensor parallelism; export for serving engines; the vLLM plugin
    {"eval"},
    {"bench"},
    {"commands"},
    {"cli", "__init__"},
    {"__main__"},
]
FLOOR = {name: i for i, names in enumerate(LAYERS) for name in names}
MAX_FILE_LINES = 400
MAX_FOLDER_SHARE = 0.20


def _modules(pkg: Path = PKG):
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent).with_suffix("")
        parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        yield path, parts, rel.name == "__init__"


def _imports(path: Path, parts: list[str], is_pkg: bool):
    """(line, imported module's parts) for every lowbit import in ``path``."""
    here = parts if is_pkg else parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            mod = base + (node.module.split(".") if node.module else [])
            names = [".".join(mod)] + [".".join(mod + [a.name]) for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "lowbit":
                yield node.lineno, name.split(".")


def _room(parts: list[str], path: Path) -> str:
    return parts[1] if len(parts) > 1 else path.stem


def _target_room(target: list[str], pkg: Path) -> str:
    if len(target) < 2:
        return "__init__"
    top = pkg / target[1]
    return target[1] if top.is_dir() or top.with_suffix(".py").exists() else "__init__"


def test_every_room_has_a_floor():
    rooms = {_room(parts, path) for path, parts, _ in _modules()}
    assert rooms <= set(FLOOR), f"folders or modules with no floor in LAYERS: {sorted(rooms - set(FLOOR))}"


def upward_imports(pkg: Path = PKG) -> list[str]:
    bad = []
    for path, parts, is_pkg in _modules(pkg):
        mine = _room(parts, path)
        for line, target in _imports(path, parts, is_pkg):
            theirs = _target_room(target, pkg)
            if theirs != mine and theirs != "__init__" and FLOOR[theirs] >= FLOOR[mine]:
                bad.append(f"{path.relative_to(pkg.parent)}:{line}: {mine} (floor {FLOOR[mine]}) imports "
                           f"{'.'.join(target)} ({theirs}, floor {FLOOR[theirs]})")
    return sorted(set(bad))


def test_no_import_runs_up_or_sideways():
    bad = upward_imports()
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_cycle_between_sibling_folders():
    """Inside a room, sub-folders (e.g. kernels/cpu and kernels/triton) never import each other
    in a cycle; a sub-folder may use its parent's modules and the parent may dispatch to it."""
    folders = {tuple(p.relative_to(PKG.parent).parts) for p in PKG.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}
    edges = defaultdict(set)
    for path, parts, is_pkg in _modules():
        src = tuple(parts if is_pkg else parts[:-1])
        for _, target in _imports(path, parts, is_pkg):
            dst = tuple(target)
            while dst and dst not in folders:
                dst = dst[:-1]
            if dst and dst != src and dst[:-1] == src[:-1]:  # siblings only
                edges[src].add(dst)
    for a, outs in edges.items():
        for b in outs:
            assert a not in edges.get(b, ()), f"folders {'/'.join(a)} and {'/'.join(b)} import each other"


def test_files_are_small_and_no_folder_holds_a_fifth():
    lines = {path: len(path.read_text().splitlines()) for path, _, _ in _modules()}
    big = {str(p.relative_to(PKG.parent)): n for p, n in lines.items() if n > MAX_FILE_LINES}
    assert not big, f"files over {MAX_FILE_LINES} lines: {big}"
    total = sum(lines.values())
    per_room = defaultdict(int)
    for p, n in lines.items():
        rel = p.relative_to(PKG)
        if len(rel.parts) > 1:
            per_room[rel.parts[0]] += n
    heavy = {room: f"{n / total:.1%}" for room, n in per_room.items() if n > MAX_FOLDER_SHARE * total}
    assert not heavy, f"folders over {MAX_FOLDER_SHARE:.0%} of lowbit's {total} lines: {heavy}"


def test_the_contract_catches_an_upward_import(tmp_path):
    """The check itself can fail: a formats module importing quantize, even inside a function."""
    fake = tmp_path / "lowbit"
    for d in (fake / "formats", fake / "quantize"):
        d.mkdir(parents=True)
        (d / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "formats" / "bad.py").write_text("def f():\n    from lowbit.quantize import apply\n")
    (fake / "quantize" / "ok.py").write_text("from ..formats import bad\n")
    bad = upward_imports(fake)
    assert bad and all(b.startswith("lowbit/formats/bad.py:2: formats (floor 1) imports lowbit.quantize") for b in bad), bad
