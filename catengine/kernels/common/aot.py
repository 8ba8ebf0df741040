"""Ahead-of-time compilation of kernel configurations for a GPU we may not have (the design notes,
../shared/design/SM70.md).

Each Triton or Gluon module lists its launch configurations with ``aot_configs(cc) -> list[AotConfig]``
(the same per-architecture table it launches with). ``python -m catengine.kernels.common.aot MODULE CC``
compiles them all and prints one JSON line per configuration; the tests call it in a subprocess
because the Triton interpreter (``TRITON_INTERPRET=1``) replaces ``triton.jit`` functions with
objects the compiler cannot take.

``@gluon.jit`` kernels are recognised by type and built through ``GluonASTSource``. Each result says whether
the PTX issues HMMA.884 (``mma884``: ``mma.sync.aligned.m8n8k4``), m16n8k16 (``mma16816``) or wgmma, and, for sm_70, whether the SASS holds it
(``sass_hmma884``; None where no disassembler here takes sm_70 cubins).
"""
from __future__ import annotations

import importlib
import json
import os
import re
import struct
import subprocess
import sys
from dataclasses import dataclass, field

SM70_SHARED_LIMIT = 96 * 1024
# PTX that sm_70 cannot run: bf16 arithmetic/conversion, cp.async, fp8 e4m3, wgmma/TMA
SM70_FORBIDDEN_PTX = (".bf16", "cp.async", "e4m3", "wgmma", "cp.async.bulk")


@dataclass(frozen=True)
class AotConfig:
    kernel: str                      # attribute name of the @triton.jit or @gluon.jit function in the module
    signature: dict                  # {"arg": "*fp16" | "i32" | "fp32" | "constexpr", ...}
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2
    name: str = ""                   # label for reports
    # integer arguments the launcher guarantees to be multiples of 16 (strides, sizes): Triton specialises
    # on that at run time, and without the hint the AOT build would not be the build that runs
    divisible_by_16: tuple[str, ...] = ()
    # integer arguments this configuration's launches pass as 1: Triton specialises a 1 into a constant at run time
    # (a different build from the one with a run-time int), so the AOT build takes them as the constant 1 too
    ones: tuple[str, ...] = ()


def build(module, cfg: AotConfig, cc: int):
    """The CompiledKernel of one configuration for sm_``cc`` (``asm`` holds its ptx and cubin)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(module, cfg.kernel)
    gluon = _is_gluon(fn)
    if gluon:   # Gluon kernels carry their own layouts and go through the Gluon front end
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # noqa: F811
    # torch allocations are 16-byte aligned, so every pointer is specialised as such at run time too
    hinted = [n for n, t in cfg.signature.items() if t.startswith("*") or n in cfg.divisible_by_16]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in hinted}
    signature = {**cfg.signature, **{n: "constexpr" for n in cfg.ones}}
    src = ASTSource(fn=fn, signature=signature, constexprs={**cfg.constexprs, **{n: 1 for n in cfg.ones}},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def compile_config(module, cfg: AotConfig, cc: int) -> dict:
    k = build(module, cfg, cc)
    gluon = _is_gluon(getattr(module, cfg.kernel))
    ptx = k.asm["ptx"]
    has_mma884 = "mma.sync.aligned.m8n8k4" in ptx
    res = cubin_resources(k.asm["cubin"], k.metadata.name)
    return {"kernel": cfg.kernel, "name": cfg.name, "cc": cc, "gluon": gluon, "shared": k.metadata.shared,
            "registers": res["registers"], "stack": res["stack"],
            "forbidden": [s for s in SM70_FORBIDDEN_PTX if s in ptx] if cc < 80 else [],
            "mma884": has_mma884, "mma16816": "mma.sync.aligned.m16n8k16" in ptx,
            "wgmma": "wgmma.mma_async" in ptx,
            "sass_hmma884": sass_has_hmma884(k.asm["cubin"]) if cc < 80 and has_mma884 else None,
            "overwritten_wgmma_operands": overwritten_wgmma_operands(k.asm.get("ttgir", ""))}


def sass_has_hmma884(cubin: bytes) -> bool | None:
    """Whether the sm_70 SASS holds HMMA.884; None when no disassembler here takes sm_70 cubins (Triton 3.9's
    cuobjdump refuses them; Triton 3.6's accepts them: point ``CATENGINE_SM70_CUOBJDUMP`` at one)."""
    sass = disassemble(cubin, 70)
    return None if sass is None else "HMMA.884" in sass


def disassemble(cubin: bytes, cc: int) -> str | None:
    """``cuobjdump -sass`` text of a cubin for sm_``cc``; None when the disassembler here refuses that
    architecture. ``CATENGINE_SM70_CUOBJDUMP`` names the tool for sm_70 (default: Triton's own)."""
    import tempfile

    import triton
    own = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    tool = (os.environ.get("CATENGINE_SM70_CUOBJDUMP") or own) if cc < 80 else own
    if not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, timeout=120)
    if out.returncode or "deprecated" in out.stderr or f"code for sm_{cc}" not in out.stdout:
        return None
    return out.stdout


def cubin_resources(cubin: bytes, kernel: str) -> dict:
    """{'registers', 'stack'} of ``kernel`` read from its cubin's ELF, for any architecture and without a
    disassembler (Triton 3.9's cuobjdump refuses sm_70): the register count (what ``cuobjdump -res-usage`` prints as
    REG) is the EIATTR_REGCOUNT attribute of .nv.info, else the top byte of the ``.text.<kernel>`` section's sh_info
    (sm_70/80 cubins carry both; sm_90 ones leave that byte 0), the stack frame in bytes per thread (spills included;
    STACK there) the EIATTR_FRAME_SIZE attribute. None where the cubin lacks one."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx]

    def name(sec):
        start = strtab[4] + sec[0]
        return cubin[start:cubin.index(b"\0", start)].decode()
    named = {name(s): s for s in secs}
    text = named.get(f".text.{kernel}")
    out = {"registers": text[7] >> 24 if text else None, "stack": None}
    # symbol index of the kernel (for the global .nv.info's per-function attributes)
    symtab = next((s for s in secs if s[1] == 2), None)
    sym_index = None
    if symtab:
        strs = secs[symtab[6]]
        for i in range(symtab[5] // 24):
            st_name, = struct.unpack_from("<I", cubin, symtab[4] + i * 24)
            start = strs[4] + st_name
            if cubin[start:cubin.index(b"\0", start)].decode() == kernel:
                sym_index = i
    for sname in (".nv.info", f".nv.info.{kernel}"):
        sec = named.get(sname)
        if not sec:
            continue
        data = cubin[sec[4]:sec[4] + sec[5]]
        pos = 0
        while pos + 4 <= len(data):
            fmt, attr, size = data[pos], data[pos + 1], struct.unpack_from("<H", data, pos + 2)[0]
            if fmt == 4:   # EIFMT_SVAL: size bytes of payload
                payload = data[pos + 4:pos + 4 + size]
                pos += 4 + size
            else:          # EIFMT_NVAL / HVAL: the 2 bytes were the value
                payload = None
                pos += 4
            if attr in (0x11, 0x2F) and payload and len(payload) == 8:   # EIATTR_FRAME_SIZE / REGCOUNT: (symbol, n)
                sym, val = struct.unpack("<II", payload)
                if sname != ".nv.info" or sym == sym_index:
                    out["stack" if attr == 0x11 else "registers"] = val
    return out


def _is_gluon(fn) -> bool:
    from triton.experimental.gluon._runtime import GluonJITFunction
    return isinstance(fn, GluonJITFunction)


def overwritten_wgmma_operands(ttgir: str) -> list[str]:
    """Pipelined shared buffers with a single slot that an asynchronous wgmma reads while a later
    wait still leaves wgmma groups in flight: the copy of the next iteration's tile then overwrites
    operands the hardware may still be reading. Triton's pipeliner (3.6, 3.9) does this to a tile
    that feeds a wgmma and also another use (a sum, say); the interpreter cannot show the result."""
    if not re.search(r"warp_group_dot_wait[^\n]*pendings = [1-9]", ttgir):
        return []
    single = set(re.findall(r"(%[\w.]+) = ttg\.local_alloc\s*(?:\{[^}]*\})?\s*: \(\) -> !ttg\.memdesc<1x", ttgir))
    view = dict(re.findall(r"(%[\w.]+) = ttg\.memdesc_index (%[\w.]+)\[", ttgir))
    hits = []
    for line in ttgir.splitlines():
        m = re.search(r"ttng\.warp_group_dot (%[\w.]+), (%[\w.]+),[^\n]*isAsync = true", line)
        if m:
            hits += [view.get(x, x) for x in m.groups() if view.get(x, x) in single]
    return sorted(set(hits))


def compile_module(module_name: str, cc: int) -> list[dict]:
    """Run in a fresh interpreter without TRITON_INTERPRET; returns one result per configuration."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "catengine.kernels.common.aot", module_name, str(cc)],
                         env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"AOT compile of {module_name} for sm_{cc} failed:\n{out.stderr[-4000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _main(module_name: str, cc: int) -> None:
    module = importlib.import_module(module_name)
    for cfg in module.aot_configs(cc):
        print(json.dumps(compile_config(module, cfg, cc)), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]))
