"""Every launch configuration of every Triton module compiles ahead of time for sm_70 (within the V100's
96 KB of shared memory and without sm_80+ instructions) and for sm_90 (without pipelined wgmma
operands that the next copy overwrites). No GPU needed."""
import pytest

from catengine.kernels.common.aot import SM70_SHARED_LIMIT, compile_module

# every module with an aot_configs list; moe.fused also builds moe.decode's kernels, attention.paged
# the split-KV reduce of attention.decode, w4a16.gemm the shared split-K reduce
AOT_MODULES = (
    "catengine.kernels.w4a16.gemm",
    "catengine.kernels.w4a16.dequant",
    "catengine.kernels.moe.fused",
    "catengine.kernels.moe.route",
    "catengine.kernels.moe.shared",
    "catengine.kernels.attention.paged",
    "catengine.kernels.attention.kv_store",
    "catengine.kernels.norm.norm_rope",
    "catengine.kernels.sampling.sampler",
    "catengine.kernels.sampling.bitmask",
    "catengine.kernels.gdn.conv1d",
    "catengine.kernels.gdn.chunk",
    "catengine.kernels.gdn.recurrent",
    "catengine.kernels.common.gemm884",
    "catengine.kernels.w4a16.gemm_sm70",
    "catengine.kernels.attention.paged_sm70",
    "catengine.kernels.gdn.chunk_o_sm70",
    "catengine.kernels.gdn.chunk_h_sm70",
    "catengine.kernels.gdn.chunk_wy_sm70",
    "catengine.kernels.moe.fused_sm70",
    "catengine.kernels.w8a16.gemv",
    "catengine.kernels.w4a16.gemm_mma",
    "catengine.kernels.moe.fused_mma",
    "catengine.kernels.w4a16.gemm_wgmma",
    "catengine.kernels.skinny.skinny",
)
# mma.sync m16n8k16 kernels: no sm_70 build (the HMMA.884 modules above serve sm_70)
SM80_ONLY = ("catengine.kernels.w4a16.gemm_mma", "catengine.kernels.moe.fused_mma")
# sm_90 only: wgmma kernels, and the skinny linear (a table on sm_90 alone; sm_70 / sm_80 keep cuBLAS)
SM90_ONLY = ("catengine.kernels.w4a16.gemm_wgmma", "catengine.kernels.skinny.skinny")


def test_aot_list_names_every_module_with_aot_configs():
    """A new kernel module with an aot_configs list is compiled here too."""
    import pathlib

    import catengine.kernels as kernels
    root = pathlib.Path(kernels.__file__).parent
    found = {"catengine.kernels." + ".".join(p.relative_to(root).with_suffix("").parts)
             for p in root.glob("*/*.py") if "\ndef aot_configs(" in p.read_text()}
    assert found == set(AOT_MODULES)


@pytest.mark.parametrize("module", AOT_MODULES)
@pytest.mark.parametrize("cc", [70, 90])
def test_module_compiles(module, cc):
    results = compile_module(module, cc)
    if (cc < 80 and module in SM80_ONLY) or (cc < 90 and module in SM90_ONLY):
        assert results == []
        return
    assert results, f"{module} lists no aot_configs for sm_{cc}"
    for r in results:
        if cc == 70:
            assert r["shared"] <= SM70_SHARED_LIMIT, f"{r} needs more shared memory than a V100 block has"
            assert not r["forbidden"], f"{r} emits instructions sm_70 lacks"
            assert r["sass_hmma884"] in (None, r["mma884"]), r
        # read off the cubin's ELF (aot.cubin_resources); spills are bench/aot_table.py's to report (under Triton
        # 3.9 gemm884's 128 x 128 tile keeps a 40-byte stack frame at 255 registers)
        assert 0 < r["registers"] <= 255 and r["stack"] is not None, r
        # every Gluon kernel is a tensor-core kernel: its products must reach m8n8k4 (sm_70 modules) or m16n8k16
        # or wgmma (the sm_80+ ones), not FMA
        assert not r["gluon"] or r["mma884"] or r["mma16816"] or r["wgmma"], f"{r}: a Gluon kernel without MMA in its PTX"
        # a single-slot pipelined buffer read by an asynchronous wgmma that is still in flight when
        # the next tile's copy lands: wrong results on Hopper only (the interpreter runs it right)
        assert not r["overwritten_wgmma_operands"], f"{r}: the next tile's copy overwrites wgmma operands"


_TTGIR = """
    %a = ttg.local_alloc : () -> !ttg.memdesc<{slots}x64x64xf16, #shared, #smem, mutable>
    %b = ttg.local_alloc : () -> !ttg.memdesc<2x64x64xf16, #shared, #smem, mutable>
    %a0 = ttg.memdesc_index %a[%i] : !ttg.memdesc<{slots}x64x64xf16> -> !ttg.memdesc<64x64xf16>
    %b0 = ttg.memdesc_index %b[%i] : !ttg.memdesc<2x64x64xf16> -> !ttg.memdesc<64x64xf16>
    %d = ttng.warp_group_dot %a0, %b0, %acc {inputPrecision = 0 : i32, isAsync = true} : ...
    %w:3 = ttng.warp_group_dot_wait %d, %a0, %b0 {pendings = {pendings} : i32} : ...
"""


@pytest.mark.parametrize("slots,pendings,flagged", [(1, 1, ["%a"]), (2, 1, []), (1, 0, [])])
def test_overwritten_wgmma_operands_reads_ttgir(slots, pendings, flagged):
    """The check flags a single-slot buffer feeding an asynchronous wgmma only while a wait leaves
    wgmma groups in flight; double-buffered operands and fully waited wgmmas pass."""
    from catengine.kernels.common.aot import overwritten_wgmma_operands
    ttgir = _TTGIR.replace("{slots}", str(slots)).replace("{pendings}", str(pendings))
    assert overwritten_wgmma_operands(ttgir) == flagged
