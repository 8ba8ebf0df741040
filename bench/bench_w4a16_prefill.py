"""Large-M W4A16: dequantise + cuBLAS against the fused Triton GEMM and cuBLAS fp16, Qwen3.5-27B shapes.

    PYTHONPATH=. python3 bench/bench_w4a16_prefill.py

For M in 256..8192: time of each path, TFLOP/s, ratio to cuBLAS fp16 on the dense weight (the peer),
and the fraction of the measured matmul rate (the hardware limit). A last table gives the dequantise
kernel alone as a fraction of copy bandwidth (4-bit + scales in, fp16 out). The ``w4a16_linear`` op
switches to dequantise + cuBLAS at ``DEQUANT_MIN_M`` rows; this table is where that row comes from.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench_gemm import GROUP, random_qweight
from common import bench_ms, copy_bandwidth_gbs, device_header, matmul_tflops, print_table

from catengine.kernels.w4a16 import dequant as w4a16_dequant
from catengine.kernels.w4a16 import gemm as w4a16
from catengine.kernels.w4a16.packing import dequantize

SHAPES = [("qkv 5120->14336", 5120, 14336), ("o_proj 6144->5120", 6144, 5120),
          ("gate_up 5120->34816", 5120, 34816), ("down 17408->5120", 17408, 5120)]
MS = [256, 512, 1024, 2048, 4096, 8192]


def main() -> None:
    print(device_header())
    bw, peak = copy_bandwidth_gbs(), matmul_tflops()
    print(f"copy bandwidth {bw:.0f} GB/s, cuBLAS fp16 {peak:.0f} TFLOP/s (8192^3)")
    rows, deq_rows = [], []
    for name, k, n in SHAPES:
        w = random_qweight(k, n, torch.float16, seed=k + n)
        dense = dequantize(w).t().contiguous()   # torch Linear layout [N, K]
        t_deq = bench_ms(lambda: w4a16_dequant.dequantize(w))
        moved = k * n // 2 + 2 * 2 * (k // GROUP) * n + 2 * k * n
        deq_rows.append([name, t_deq * 1e3, moved / t_deq / 1e6 / bw])
        for m in MS:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            flop = 2 * m * k * n
            t_cublas = bench_ms(lambda: F.linear(x, dense))
            t_fused = bench_ms(lambda: w4a16.fused_w4a16_linear(x, w))
            t_dq = bench_ms(lambda: torch.matmul(x, w4a16_dequant.dequantize(w)))
            rows.append([name, m, t_fused * 1e3, t_dq * 1e3, t_cublas * 1e3, flop / t_dq / 1e9,
                         t_cublas / t_fused, t_cublas / t_dq, flop / t_dq / 1e9 / peak])
        dense = x = None   # free before the next shape
        torch.cuda.empty_cache()
    print_table("W4A16 large M: fused Triton GEMM vs dequantise + cuBLAS (fp16, group 128)",
                ["shape", "M", "fused us", "dequant+cuBLAS us", "cuBLAS fp16 us", "dequant+cuBLAS TFLOP/s",
                 "fused x cuBLAS", "dequant+cuBLAS x cuBLAS", "fraction of matmul rate"], rows)
    print_table("dequantise kernel alone", ["shape", "us", "fraction of copy bandwidth"], deq_rows)


if __name__ == "__main__":
    main()
