"""No module of catengine imports another module's private name (``from M import _x``), and no kernel family
reaches into another family's private names: a helper two files share gets a public name where it lives."""
import ast
import pathlib

import catengine

ROOT = pathlib.Path(catengine.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _family(module: str) -> str | None:
    """``w4a16`` for ``catengine.kernels.w4a16.gemm``; None outside the family packages."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["catengine", "kernels"] else None


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Each private import in ``source`` (the text of ``module``), as 'module: from M import _x'."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            target = _resolve(module, is_package, node)
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{module}: from {target} import {alias.name}")
    return out + _cross_family_attributes(source, module, is_package)


def _cross_family_attributes(source: str, module: str, is_package: bool) -> list[str]:
    """``fam.mod._x`` reached through an imported module of another kernel family."""
    tree = ast.parse(source)
    here = _family(module)
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            target = _resolve(module, is_package, node)
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = aliases[node.value.id]
            there = _family(owner) or _family(owner + ".x")
            if there is not None and there != here:
                out.append(f"{module}: {owner}.{node.attr} (family {there})")
    return out


# torch 2.11 has symmetric memory (the optional one-shot all-reduce of issue 22) only under private names; the
# one module that needs them is named here, each name on its own, so nothing else may reach into torch's privates
TORCH_PRIVATE_OK = {
    "catengine.distributed.oneshot: from torch._C._distributed_c10d import _register_process_group",
    "catengine.distributed.oneshot: from torch._C._distributed_c10d import _SymmetricMemory",
    "catengine.distributed.oneshot: from torch.distributed import _symmetric_memory",
}


def test_no_private_name_is_imported_anywhere_in_catengine():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found += violations(path.read_text(), _module_name(path), path.name == "__init__.py")
    found = [f for f in found if f not in TORCH_PRIVATE_OK]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_the_check_catches_what_it_forbids():
    gdn = "catengine.kernels.gdn.recurrent"
    assert violations("from .table import _pad, rows\n", gdn) == [
        "catengine.kernels.gdn.recurrent: from catengine.kernels.gdn.table import _pad"]
    assert violations("from ..w4a16.gemv import _gemv_rows\n", "catengine.kernels.moe.decode") == [
        "catengine.kernels.moe.decode: from catengine.kernels.w4a16.gemv import _gemv_rows"]
    assert violations("from __future__ import annotations\nfrom .table import pad\n", gdn) == []
    assert violations("from ..w4a16 import gemm\ngemm._pair(1)\n", "catengine.kernels.moe.fused") == [
        "catengine.kernels.moe.fused: catengine.kernels.w4a16.gemm._pair (family w4a16)"]
    # inside one family, a module's own private helpers stay reachable through the module object
    assert violations("from . import gemm\ngemm._pair(1)\n", "catengine.kernels.w4a16.dequant") == []
