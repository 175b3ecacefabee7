"""RWKV depthwise causal convolution: a Taichi ndarray kernel via td.torch.function vs pure torch.

    out[b, c, t] = eps + sum_{u <= t} w[c, 0, T-1-(t-u)] * k[b, c, u]

Times forward+backward (median of repeats, after a warm-up that compiles) of
    tidiff:  td.torch.function over the Taichi kernel (zero-copy, Taichi's reverse mode)
    torch:   EPS + F.conv1d(F.pad(k, (T-1, 0)), w, groups=C)
on the same data in one process, float64 and float32, and prints the ratio
tidiff / torch (below 1: tidiff is faster). Compile time is reported apart.

    python bench/rwkv.py            # a few (B, C, T)
    python bench/rwkv.py --quick    # small sizes only
"""
import argparse
import os
import pathlib
import runpy
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle threads otherwise spin beside Taichi's

import taichi as ti  # noqa: E402
import torch  # noqa: E402
from common import median_seconds  # noqa: E402  (bench/common.py: bench/ is on sys.path as the script's folder)

import tidiff as td  # noqa: E402

# the operator and the pure-torch formulation of examples/rwkv_operator.py
example = runpy.run_path(str(pathlib.Path(__file__).parents[1] / "examples" / "rwkv_operator.py"), run_name="bench")
torch_conv = example["rwkv_conv_torch"]


def fwd_bwd(op, k, w, cot):
    k.grad = w.grad = None
    op(k, w).backward(cot)
    ti.sync()


def median_ms(fn, repeats):
    return median_seconds(fn, repeats) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    # ERROR: float32 runs warn that eps (f64) is added to f32 elements; that is intended
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR)
    op = example["rwkv_conv"]
    sizes = [(2, 16, 64), (8, 32, 128)] if args.quick else [(2, 16, 64), (8, 32, 128), (8, 64, 256), (4, 128, 512)]
    print(f"torch {torch.__version__}, taichi {ti.__version__}, threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print(f"{'dtype':8} {'(B, C, T)':>16} {'tidiff ms':>10} {'torch ms':>10} {'ratio':>7}  max|diff|")
    for dtype in (torch.float64, torch.float32):
        for B, C, T in sizes:
            g = torch.Generator().manual_seed(0)
            k = torch.randn(B, C, T, dtype=dtype, generator=g).requires_grad_()
            w = torch.randn(C, 1, T, dtype=dtype, generator=g).requires_grad_()
            cot = torch.randn(B, C, T, dtype=dtype, generator=g)
            t0 = time.perf_counter()
            fwd_bwd(op, k, w, cot)  # warm-up: compiles once per dtype, then never again
            warm = (time.perf_counter() - t0) * 1e3
            diff = (op(k, w) - torch_conv(k, w)).abs().max().item()
            fwd_bwd(torch_conv, k, w, cot)
            ours = median_ms(lambda k=k, w=w, cot=cot: fwd_bwd(op, k, w, cot), args.repeats)
            theirs = median_ms(lambda k=k, w=w, cot=cot: fwd_bwd(torch_conv, k, w, cot), args.repeats)
            print(f"{str(dtype).replace('torch.', ''):8} {str((B, C, T)):>16} {ours:10.3f} {theirs:10.3f} "
                  f"{ours / theirs:7.2f}  {diff:.1e}   (first call {warm:.0f} ms)")
    print("compiles:", td.cache_info()["rwkv_conv"])
    print()
    runpy.run_path(str(pathlib.Path(__file__).with_name("torch_overhead.py")), run_name="bench")["report"]()


if __name__ == "__main__":
    sys.exit(main())
