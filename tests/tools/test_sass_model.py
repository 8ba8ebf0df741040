"""The static SASS counts and the roofline of bench/v100_projection.py, on a hand-written sm_70 snippet (no GPU,
no compiler): classes, loops, trip counts, HMMA flops, shared-memory bytes and each bound's arithmetic."""
import pytest

from catengine.errors import ConfigError
from catengine.tools import sass_model as sm

# one program: a prologue, a loop body (two LDS, one STS, four HMMA.884 steps = one m8n8k4, an FFMA, a counter and
# the backward branch), an epilogue with a store; the trap self-branch and NOP padding at the end
SNIPPET = """
	code for sm_70
		Function : toy_kernel
	.headerflags	@"EF_CUDA_SM70"
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;                  /* 0x00000a00ff017624 */
                                                                                            /* 0x000fe400078e00ff */
        /*0010*/                   LDG.E.128.SYS R4, [R2] ;                                 /* 0x0000000002047381 */
        /*0020*/                   STS.128 [R107], R4 ;                                     /* 0x000000046b007388 */
        /*0030*/                   LDS.U.128 R76, [R106] ;                                  /* 0x000000006a4c7984 */
        /*0040*/                   LDS.U R78, [R105+0x1000] ;                               /* 0x00100000694e7984 */
        /*0050*/                   HMMA.884.F32.F32.STEP0 R84, R76.reuse.ROW, R94.reuse.COL, R84 ;
        /*0060*/                   HMMA.884.F32.F32.STEP1 R86, R76.reuse.ROW, R94.reuse.COL, R86 ;
        /*0070*/                   HMMA.884.F32.F32.STEP2 R96, R76.reuse.ROW, R94.reuse.COL, R80 ;
        /*0080*/                   HMMA.884.F32.F32.STEP3 R98, R76.ROW, R94.COL, R82 ;
        /*0090*/                   FFMA R8, R9, R10, R8 ;                                   /* 0x0000000a09087223 */
        /*00a0*/                   IADD3 R0, R0, 0x1, RZ ;                                  /* 0x0000000100007810 */
        /*00b0*/                   ISETP.GE.AND P0, PT, R0, c[0x0][0x170], PT ;             /* 0x00005c0000007a0c */
        /*00c0*/              @!P0 BRA 0x20 ;                                               /* 0xffffff5000008947 */
        /*00d0*/                   STG.E.SYS [R2], R8 ;                                     /* 0x0000000802007386 */
        /*00e0*/                   EXIT ;                                                   /* 0x000000000000794d */
        /*00f0*/                   BRA 0xf0;                                                /* 0xfffffff000007947 */
        /*0100*/                   NOP;                                                     /* 0x0000000000007918 */
"""


def test_parse_and_classify():
    funcs = sm.parse_sass(SNIPPET)
    assert list(funcs) == ["toy_kernel"]
    ins = funcs["toy_kernel"]
    assert len(ins) == 17 and ins[0].opcode == "IMAD.MOV.U32" and ins[12].pred == "@!P0"
    assert [sm.classify(i.opcode) for i in ins[1:6]] == ["ldg", "sts", "lds", "lds", "hmma"]
    assert sm.classify("HFMA2.MMA") == "hfma2" and sm.classify("LDSM.16.M88.4") == "lds"
    assert sm.classify("LDGSTS.E.BYPASS.LTC128B.128") == "ldg"


def test_wgmma_opcodes_keep_their_shape():
    """sm_90 SASS spells the warpgroup MMA's shape in lower case; the opcode must keep it to count its flops."""
    text = """
		Function : wg_kernel
        /*0100*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], R24, gsb0 ;        /* 0x00000000041879f0 */
        /*0110*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR6][R4.64] ;     /* 0x0000000004037fae */
"""
    ins = sm.parse_sass(text)["wg_kernel"]
    assert ins[0].opcode == "HGMMA.64x128x16.F32" and ins[0].operands.startswith("R24")
    c = sm.count(ins)
    assert c.mma_flops == 2 * 64 * 128 * 16 // 4 and c.ldg_bytes == 512 and c.classes["ldg"] == 1


def test_loops_skip_the_trap_self_branch():
    ins = sm.parse_sass(SNIPPET)["toy_kernel"]
    assert sm.loops(ins) == [(2, 12)]


def test_matrix_flops_and_shared_bytes_per_warp_instruction():
    # m8n8k4 with fp32 accumulation: 4 quad-pairs x 8x8x4 x 2 = 2048 flops over four steps
    assert sm.mma_flops("HMMA.884.F32.F32.STEP0") == 512
    assert sm.mma_flops("HMMA.16816.F32") == 2 * 16 * 8 * 16
    assert sm.mma_flops("HGMMA.64x128x16.F32") == 2 * 64 * 128 * 16 // 4
    assert sm.mma_flops("FFMA") == 0
    assert sm.smem_bytes("LDS.U.128") == 512 and sm.smem_bytes("LDS.U") == 128 and sm.smem_bytes("STS.64") == 256
    assert sm.smem_bytes("LDSM.16.M88.4") == 512 and sm.smem_bytes("LDG.E.128") == 0


def test_trip_counts_weight_the_loop_body():
    ins = sm.parse_sass(SNIPPET)["toy_kernel"]
    once = sm.count(ins)
    assert once.total == 16          # the NOP is padding, everything else (the trap included) counts once
    c = sm.count(ins, (10,))
    # 11 instructions in the loop (0x20..0xc0) run 10 times, 5 outside once
    assert c.total == 11 * 10 + 5
    assert c.classes["hmma"] == 40 and c.classes["lds"] == 20 and c.classes["sts"] == 10
    assert c.classes["ldg"] == 1 and c.classes["stg"] == 1 and c.classes["ffma"] == 10
    assert c.mma_flops == 40 * 512
    assert c.smem_bytes == 10 * (512 + 512 + 128)
    assert c.fp_pipe == 10 + 1        # FFMA in the loop, IMAD outside
    assert c.alu_pipe == 20           # IADD3 and ISETP in the loop


def test_bounds_arithmetic_on_the_v100():
    ins = sm.parse_sass(SNIPPET)["toy_kernel"]
    c = sm.count(ins, (10,))
    # 160 programs of 4 warps on 80 SMs: 2 programs = 8 warps per SM over 4 schedulers
    b = sm.bounds(c, 160, 4, sm.V100, dram_bytes=9e4)
    cyc = 1 / 1.53e9
    assert b["issue"] == pytest.approx(8 * 115 / 4 * cyc)
    assert b["fp"] == pytest.approx(8 * 11 * 2 / 4 * cyc)        # 16 FP32 lanes per scheduler
    assert b["alu"] == pytest.approx(8 * 20 * 2 / 4 * cyc)
    assert b["mma"] == pytest.approx(8 * 40 * 512 / (125e12 / 80))
    assert b["smem"] == pytest.approx(8 * 11520 / 128 * cyc)
    assert b["dram"] == pytest.approx(1e-7)
    t, name = sm.bound_time(b)
    assert name == "smem" and t == b["smem"]
    # one program of one warp: a single scheduler issues everything
    one = sm.bounds(c, 1, 1, sm.V100, 0.0)
    assert one["issue"] == pytest.approx(115 * cyc)


def test_h200_issues_ffma_at_full_rate():
    c = sm.count(sm.parse_sass(SNIPPET)["toy_kernel"], (10,))
    chip = sm.h200(900e12, 4.2e12, clock_hz=2e9)
    b = sm.bounds(c, 132, 4, chip, 0.0)
    assert b["fp"] == pytest.approx(11 / 2e9)


def test_bounds_reject_an_empty_launch():
    with pytest.raises(ConfigError):
        sm.bounds(sm.Counts(), 0, 4, sm.V100, 0.0)


# ---------------------------------------------------------------- the latency-aware terms
def test_global_load_bytes_registers_and_iterations():
    assert sm.ldg_bytes("LDG.E.128.SYS") == 512 and sm.ldg_bytes("LDG.E.U16") == 64 and sm.ldg_bytes("LDG.E") == 128
    assert sm.ldg_bytes("LDS.U.128") == 0
    ins = sm.parse_sass(SNIPPET)["toy_kernel"]
    assert sm.registers(ins) == 108            # R107 is the highest register named
    c = sm.count(ins, (10,))
    assert c.iterations == 10 and c.ldg_bytes == 512     # the one LDG is before the loop
    assert sm.count(ins).iterations == 1


def test_occupancy_from_registers_shared_memory_and_warps():
    # 128 registers x 32 lanes = 4096 per warp: 4 programs of 4 warps fill the 64K registers
    assert sm.occupancy(sm.V100, 4, 128, 0) == 4
    assert sm.occupancy(sm.V100, 4, 128, 40 * 1024) == 2      # 96 KB / 40 KB
    assert sm.occupancy(sm.V100, 4, 0, 0) == 16               # 64 warps
    assert sm.occupancy(sm.V100, 1, 8, 0) == 32               # the program limit
    assert sm.occupancy(sm.V100, 8, 255, 0) == 1
    # 108 registers round up to 112 per lane (256 per warp): 3584 per warp, 4 programs of 4 warps
    assert sm.occupancy(sm.V100, 4, 108, 0) == 4


def test_latency_rounds_and_l2():
    c = sm.count(sm.parse_sass(SNIPPET)["toy_kernel"], (10,))
    cyc = 1 / 1.53e9
    # 160 programs on 80 SMs: 2 per SM, 4 resident -> one round of (10 trips + prologue + epilogue) loads
    b = sm.latency_bounds(c, 160, 4, sm.V100, 108, 0)
    assert b["latency"] == pytest.approx(12 * 400 * cyc)
    assert b["l2"] == pytest.approx(160 * 4 * 512 / 2.1e12)
    # 800 programs: 10 per SM in rounds of 4 -> 3 rounds
    assert sm.latency_bounds(c, 800, 4, sm.V100, 108, 0)["latency"] == pytest.approx(3 * 12 * 400 * cyc)


def test_launch_model_scales_latency_and_adds_the_launch_cost():
    c = sm.count(sm.parse_sass(SNIPPET)["toy_kernel"], (10,))
    chip = sm.V100.__class__(**{**sm.V100.__dict__, "launch_s": 2e-6})
    lm = sm.launch_model(c, 160, 4, chip, 9e4, 108, 0)
    lat = 12 * 400 / 1.53e9
    assert lm.time(1.0) == (pytest.approx(2e-6 + lat), "latency")
    assert lm.time(3.0)[0] == pytest.approx(2e-6 + 3 * lat)
    # a factor small enough that shared memory binds again
    smem = lm.throughput["smem"]
    assert lm.time(0.01) == (pytest.approx(2e-6 + smem), "smem")


def test_fit_factor_recovers_the_latency_factor():
    c = sm.count(sm.parse_sass(SNIPPET)["toy_kernel"], (10,))
    cases = []
    for programs in (80, 800, 8000):
        ms = [sm.launch_model(c, programs, 4, sm.V100, 1e5, 108, 0)]
        cases.append((ms, sum(m.time(3.0)[0] for m in ms)))
    assert sm.fit_factor(cases) == pytest.approx(3.0, rel=0.02)
    with pytest.raises(ConfigError):
        sm.fit_factor([])


def test_prefetch_depth_divides_the_loop_waits():
    c = sm.count(sm.parse_sass(SNIPPET)["toy_kernel"], (10,))
    one = sm.latency_bounds(c, 160, 4, sm.V100, 108, 0)["latency"]
    three = sm.latency_bounds(c, 160, 4, sm.V100, 108, 0, prefetch=3)["latency"]
    assert three == pytest.approx(one * (10 / 3 + 2) / 12)
    assert sm.prefetch_depth(90, 4, False) == 3 and sm.prefetch_depth(90, 4, True) == 1
    assert sm.prefetch_depth(70, 3, False) == 1 and sm.prefetch_depth(90, 1, False) == 1
