"""Static SASS counts and a roofline of issue, pipes, shared memory and DRAM: how long a kernel would take on a
chip we do not have (bench/v100_projection.py; issue 18's "V100 projection, never a claim of measured speed").

A kernel's SASS (``cuobjdump -sass`` text) is split into instructions; backward branches mark loops. Given the
trip count of each top-level loop (in address order; the launcher's shapes decide them, not the SASS), every
instruction's dynamic count per warp is its static count times the trips of the loops around it (a nested loop
counts once per trip of its parent: its own trips are not modelled). Predicated-off and branched-over code is
counted as executed, so the counts are upper bounds for kernels with masked tails or early exits.

The time of one launch is the largest of these bounds, each on the busiest SM (programs spread evenly, whole
programs per SM):

- issue: one warp instruction per scheduler per cycle;
- the FP32 / fp16x2 pipe (FFMA, FADD, FMUL, HFMA2, HADD2, HMUL2, IMAD), the integer ALU pipe, MUFU: cycles per
  warp instruction from the chip's lane counts;
- tensor cores: the flops each HMMA / HGMMA instruction does against the chip's matrix rate;
- shared memory: LDS/STS/LDSM bytes against the chip's bytes per cycle per SM;
- DRAM: the launch's compulsory bytes against the chip's bandwidth.

Those are throughput bounds; on the H200 they came out 56-98% below the measured times (bench/NOTES.md, issue
18), mostly on launches that are too small or too short to reach any throughput. :func:`launch_time` adds what a
roofline leaves out (Hong and Kim's memory-warp-parallelism argument in its simplest form):

- occupancy: the programs an SM holds at once, from registers (read off the SASS), shared memory, warps and the
  chip's program limit; programs beyond that run in later rounds on the same SM;
- latency: every trip of a top-level loop waits for at least one dependent global load (a pipeline that keeps
  d tiles in flight: one per d trips), and the prologue and epilogue for one each, so each round of resident programs takes
  ``(trips + 2) x latency`` however few instructions it issues; the latency is the chip's public unloaded figure
  times one loaded-latency factor, the one constant fitted on the H200 (bench/v100_projection.py says on what);
- L2: the bytes the LDG instructions request (all warps, re-reads included) against the L2's bandwidth;
- launch: a fixed per-launch cost (start-up and drain), measured on the H200 in the same run.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import ConfigError

# the opcode may hold lower case: HGMMA.64x128x16.F32 (cutting it at the first "x" cost the sm_90 GEMMs every
# tensor-core flop in the first H200 calibration)
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_FUNC = re.compile(r"Function\s*:\s*(\S+)")

FP_PIPE = ("FFMA", "FADD", "FMUL", "HFMA2", "HADD2", "HMUL2", "IMAD", "FMNMX", "HMNMX2")
ALU_PIPE = ("LOP3", "IADD3", "SHF", "ISETP", "FSETP", "HSETP2", "LEA", "PRMT", "SEL", "FSEL", "IMNMX", "VIADD",
            "VIADDMNMX", "SGXT", "FLO", "POPC", "BMSK", "PLOP3", "CSET", "CSETP")
MUFU_PIPE = ("MUFU",)
# the classes the tables print, in order
CLASSES = ("hmma", "ffma", "hfma2", "fp_other", "ldg", "stg", "lds", "sts", "other")


@dataclass(frozen=True)
class Instr:
    addr: int
    pred: str
    opcode: str           # full opcode with modifiers, e.g. HMMA.884.F32.F32.STEP0
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """cuobjdump -sass / nvdisasm text -> {function name: instructions in address order}."""
    funcs: dict[str, list[Instr]] = {}
    cur = None
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = _LINE.search(line)
        if m and cur is not None:
            cur.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return funcs


def classify(opcode: str) -> str:
    """One of CLASSES for an opcode (modifiers ignored except to tell the matrix instructions apart)."""
    base = opcode.split(".")[0]
    if base in ("HMMA", "HGMMA", "IMMA", "IGMMA"):
        return "hmma"
    if base == "FFMA":
        return "ffma"
    if base == "HFMA2":
        return "hfma2"
    if base in ("FADD", "FMUL", "HADD2", "HMUL2", "FMNMX", "HMNMX2"):
        return "fp_other"
    if base in ("LDG", "LDGSTS"):      # LDGSTS: cp.async, global -> shared without registers (sm_80+)
        return "ldg"
    if base in ("STG", "RED", "ATOM", "ATOMG", "REDG"):
        return "stg"
    if base in ("LDS", "LDSM"):
        return "lds"
    if base == "STS":
        return "sts"
    return "other"


def mma_flops(opcode: str) -> int:
    """Flops one warp's instance of a matrix instruction does (0 for anything else).

    HMMA.884.F32.F32.STEPn: mma.m8n8k4 with fp32 accumulation is four steps of a warp-wide 2 x 8x8x4 x 4
    quad-pairs = 2048 flops, so 512 per step (fp16 accumulation: two steps, 1024 each). HMMA.1688: 16x8x8,
    HMMA.16816: 16x8x16. HGMMA.64xNx16 runs on a warpgroup: each of its four warps counts a quarter."""
    parts = opcode.split(".")
    if parts[0] == "HMMA" and len(parts) > 1:
        if parts[1] == "884":
            return 1024 if "F16" in parts[2:3] else 512
        shapes = {"1688": (16, 8, 8), "16816": (16, 8, 16), "16832": (16, 8, 32)}
        if parts[1] in shapes:
            a, b, c = shapes[parts[1]]
            return 2 * a * b * c
    if parts[0] == "HGMMA" and len(parts) > 1:
        m = re.fullmatch(r"64x(\d+)x(\d+)", parts[1])
        if m:
            return 2 * 64 * int(m.group(1)) * int(m.group(2)) // 4
    return 0


def smem_bytes(opcode: str) -> int:
    """Bytes one warp moves through shared memory with this instruction (0 if it does not touch it)."""
    parts = opcode.split(".")
    if parts[0] == "LDSM":       # LDSM.16.M88.4: four 8x8 matrices of 16-bit values, 128 bytes each
        return 128 * (int(parts[-1]) if parts[-1] in ("1", "2", "4") else 1)
    if parts[0] not in ("LDS", "STS"):
        return 0
    width = 4
    for p in parts[1:]:
        if p in ("128", "64", "32"):
            width = int(p) // 8
        elif p in ("U8", "S8"):
            width = 1
        elif p in ("U16", "S16"):
            width = 2
    return 32 * width


def loops(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(first, last) instruction index of each loop: a branch to an earlier address (self-branches, the
    trap at the end of every kernel, are not loops)."""
    index = {ins.addr: i for i, ins in enumerate(instrs)}
    out = []
    for i, ins in enumerate(instrs):
        if ins.base not in ("BRA", "JMP"):
            continue
        m = re.search(r"0x([0-9a-f]+)", ins.operands)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < ins.addr and target in index:
            out.append((index[target], i))
    return sorted(set(out))


def ldg_bytes(opcode: str) -> int:
    """Bytes one warp requests from L1/L2 with a global load or cp.async (0 for anything else; TMA's UTMALDG moves
    a box its descriptor sizes, which the SASS does not show)."""
    parts = opcode.split(".")
    return 32 * _width(parts) if parts[0] in ("LDG", "LDGSTS") else 0


def local_bytes(opcode: str) -> int:
    """Bytes one warp moves to or from local memory (STL / LDL: register spills, or arrays ptxas could not keep in
    registers); 0 for anything else. Not in any bound: on the V100 they hit L1 or go to L2, which the SASS does not
    say; the tables print them beside a kernel whose SASS has them."""
    parts = opcode.split(".")
    return 32 * _width(parts) if parts[0] in ("LDL", "STL") else 0


def _width(parts: list[str]) -> int:
    """Bytes per lane of a load or store from its opcode's modifiers (32-bit unless one says otherwise)."""
    width = 4
    for p in parts[1:]:
        if p in ("128", "64"):
            width = int(p) // 8
        elif p in ("U8", "S8"):
            width = 1
        elif p in ("U16", "S16"):
            width = 2
    return width


_REG = re.compile(r"\bR(\d+)\b")


def registers(instrs: list[Instr]) -> int:
    """Registers per thread the SASS uses: the highest R index + 1, rounded up to ptxas's even allocation (the
    cubin's own count can be a few higher: that only lowers occupancy where it is at a boundary)."""
    hi = max((int(r) for ins in instrs for r in _REG.findall(ins.operands)), default=0) + 1
    return hi + (hi & 1)


@dataclass
class Counts:
    """Dynamic counts per warp of one program (floats: trips may be averages)."""
    classes: dict = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    total: float = 0.0
    fp_pipe: float = 0.0
    alu_pipe: float = 0.0
    mufu: float = 0.0
    mma_flops: float = 0.0
    smem_bytes: float = 0.0
    ldg_bytes: float = 0.0
    local_bytes: float = 0.0    # STL / LDL (spills): printed, in no bound
    iterations: float = 0.0     # trips of the top-level loops, summed: dependent global-load waits per warp
    loops: int = 0
    nested: bool = False


def count(instrs: list[Instr], trips: tuple[float, ...] = ()) -> Counts:
    """Dynamic counts per warp: each top-level loop (address order) runs ``trips[i]`` times (the last value
    repeats for later loops; no trips: every loop once)."""
    lps = loops(instrs)
    top = [lp for lp in lps if not any(o != lp and o[0] <= lp[0] and lp[1] <= o[1] for o in lps)]
    weight = [1.0] * len(instrs)
    for j, (a, b) in enumerate(top):
        t = float(trips[min(j, len(trips) - 1)]) if trips else 1.0
        for i in range(a, b + 1):
            weight[i] = t
    c = Counts(loops=len(top), nested=len(lps) > len(top))
    c.iterations = sum(float(trips[min(j, len(trips) - 1)]) if trips else 1.0 for j in range(len(top)))
    for ins, w in zip(instrs, weight):
        if ins.base == "NOP":     # alignment padding after the last EXIT
            continue
        c.total += w
        c.classes[classify(ins.opcode)] += w
        if ins.base in FP_PIPE:
            c.fp_pipe += w
        elif ins.base in ALU_PIPE:
            c.alu_pipe += w
        elif ins.base in MUFU_PIPE:
            c.mufu += w
        c.mma_flops += w * mma_flops(ins.opcode)
        c.smem_bytes += w * smem_bytes(ins.opcode)
        c.ldg_bytes += w * ldg_bytes(ins.opcode)
        c.local_bytes += w * local_bytes(ins.opcode)
    return c


@dataclass(frozen=True)
class Chip:
    name: str
    sms: int
    clock_hz: float
    mma_flops: float            # dense fp16 tensor rate, flop/s
    dram_bps: float             # bytes/s
    schedulers: int = 4
    fp_cycles: float = 2.0      # cycles one warp instruction holds a scheduler's FP32 pipe (32 lanes / lanes)
    alu_cycles: float = 2.0
    mufu_cycles: float = 8.0
    smem_bytes_per_clk: int = 128   # per SM
    # occupancy limits per SM
    max_warps: int = 64
    max_programs: int = 32
    regs_per_sm: int = 65536
    smem_per_sm: int = 96 * 1024
    mem_latency_cycles: float = 400.0   # a global load that misses L2, unloaded
    l2_bps: float = 2.1e12
    launch_s: float = 0.0               # fixed cost per launch (start-up, drain); the caller's, measured


# V100 SXM2 (the facts and SM70.md): 80 SMs x 4 schedulers, 1.53 GHz boost, 16 FP32 and 16 INT32 lanes
# and 4 SFUs per scheduler, 125 TFLOP/s HMMA.884, 32 banks x 4 B per cycle, 900 GB/s, 6 MB L2, 64K registers,
# 96 KB of shared memory, 64 warps and 32 programs per SM; a global load ~400 cycles and L2 ~2.1 TB/s
# (Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking", 2018)
V100 = Chip("V100", 80, 1.53e9, 125e12, 900e9)


def h200(mma_flops: float, dram_bps: float, clock_hz: float = 1.98e9, sms: int = 132, launch_s: float = 0.0) -> Chip:
    """H200 SXM: 32 FP32 lanes per scheduler (FFMA at one warp instruction per cycle), 16 INT32, 228 KB of shared
    memory per SM, a global load ~480 cycles unloaded and L2 ~5.5 TB/s (Luo et al., "Benchmarking and Dissecting
    the Nvidia Hopper GPU Architecture", 2024, on the H800's same SM; L2 from public microbenchmarks of the H100);
    the matrix and copy rates and the launch cost are the caller's, measured in the same run."""
    return Chip("H200", sms, clock_hz, mma_flops, dram_bps, fp_cycles=1.0, smem_per_sm=228 * 1024,
                mem_latency_cycles=480.0, l2_bps=5.5e12, launch_s=launch_s)


def bounds(c: Counts, programs: int, warps: int, chip: Chip, dram_bytes: float) -> dict[str, float]:
    """Seconds each resource needs for one launch of ``programs`` programs of ``warps`` warps."""
    if programs <= 0 or warps <= 0:
        raise ConfigError(f"a launch needs programs and warps, got {programs} x {warps}")
    per_sm = math.ceil(programs / chip.sms)             # programs on the busiest SM
    warps_sm = per_sm * warps
    sched = min(chip.schedulers, warps_sm)              # schedulers that have a warp at all
    cyc = 1.0 / chip.clock_hz
    return {
        "issue": warps_sm * c.total / sched * cyc,
        "fp": warps_sm * c.fp_pipe * chip.fp_cycles / sched * cyc,
        "alu": warps_sm * c.alu_pipe * chip.alu_cycles / sched * cyc,
        "mufu": warps_sm * c.mufu * chip.mufu_cycles / sched * cyc,
        "mma": warps_sm * c.mma_flops / (chip.mma_flops / chip.sms),
        "smem": warps_sm * c.smem_bytes / chip.smem_bytes_per_clk * cyc,
        "dram": dram_bytes / chip.dram_bps,
    }


def bound_time(b: dict[str, float]) -> tuple[float, str]:
    """(seconds, name of the binding resource)."""
    name = max(b, key=b.get)
    return b[name], name


def occupancy(chip: Chip, warps: int, regs: int, shared: int) -> int:
    """Programs of ``warps`` warps one SM holds at once (registers are allocated per warp in 256s); at least 1."""
    per_warp = -(-regs * 32 // 256) * 256
    limits = [chip.max_programs, chip.max_warps // warps]
    if per_warp:
        limits.append(chip.regs_per_sm // (per_warp * warps))
    if shared:
        limits.append(chip.smem_per_sm // shared)
    return max(1, min(limits))


def latency_bounds(c: Counts, programs: int, warps: int, chip: Chip, regs: int, shared: int,
                   prefetch: int = 1) -> dict[str, float]:
    """Seconds of the two terms a roofline misses, at latency factor 1: ``latency`` (rounds of resident programs,
    each waiting one global load per ``prefetch`` loop trips, the tiles a pipeline keeps in flight, and two
    outside loops) and ``l2`` (requested bytes)."""
    per_sm = math.ceil(programs / chip.sms)
    rounds = math.ceil(per_sm / occupancy(chip, warps, regs, shared))
    waits = c.iterations / max(1, prefetch) + 2
    return {"latency": rounds * waits * chip.mem_latency_cycles / chip.clock_hz,
            "l2": programs * warps * c.ldg_bytes / chip.l2_bps}


@dataclass(frozen=True)
class LaunchModel:
    """One launch's bounds, split so that the loaded-latency factor can be fitted after the fact."""
    throughput: dict            # bounds(): issue, pipes, tensor cores, shared memory, DRAM
    latency: dict               # latency_bounds() at factor 1
    launch_s: float

    def time(self, factor: float) -> tuple[float, str]:
        """(seconds, binding term) with the global-load latency scaled by ``factor``."""
        b = {**self.throughput, "l2": self.latency["l2"], "latency": self.latency["latency"] * factor}
        t, name = bound_time(b)
        return self.launch_s + t, name


def launch_model(c: Counts, programs: int, warps: int, chip: Chip, dram_bytes: float, regs: int,
                 shared: int, prefetch: int = 1) -> LaunchModel:
    return LaunchModel(bounds(c, programs, warps, chip, dram_bytes),
                       latency_bounds(c, programs, warps, chip, regs, shared, prefetch), chip.launch_s)


def prefetch_depth(cc: int, num_stages: int, gluon: bool) -> int:
    """Loop trips of loads a kernel keeps in flight: Triton's pipeliner issues ``num_stages - 1`` tiles ahead with
    cp.async / TMA (sm_80+); on sm_70 (no cp.async) it does not pipeline loads, and the Gluon HMMA.884 kernels
    prefetch one tile into registers by hand."""
    return max(1, num_stages - 1) if cc >= 80 and not gluon else 1


def fit_factor(pairs: list[tuple[list[LaunchModel], float]], lo: float = 0.25, hi: float = 16.0) -> float:
    """The latency factor that minimises the squared log error of (launches, measured seconds) pairs: a grid in
    log space (the error is piecewise smooth in the factor, a grid needs no derivative)."""
    if not pairs:
        raise ConfigError("fit_factor needs at least one measured case")
    grid = [lo * (hi / lo) ** (i / 400) for i in range(401)]

    def loss(f):
        return sum(math.log(sum(m.time(f)[0] for m in ms) / t) ** 2 for ms, t in pairs)
    return min(grid, key=loss)


__all__ = ["CLASSES", "Chip", "Counts", "Instr", "LaunchModel", "V100", "bound_time", "bounds", "classify", "count",
           "fit_factor", "h200", "latency_bounds", "launch_model", "ldg_bytes", "local_bytes", "loops", "mma_flops", "occupancy",
           "parse_sass", "prefetch_depth", "registers", "smem_bytes"]
