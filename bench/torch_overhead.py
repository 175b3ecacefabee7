"""Call overhead of a td.torch.function operator against a plain torch.autograd.Function calling the same
Taichi kernel (issue 14, item 5).

The kernel is the RWKV ndarray kernel of examples/rwkv_operator.py at a tiny size (1, 4, 8), so
that a call costs little more than its launches. Rows, per call (median of rounds, round-robin):

    plain autograd.Function   forward: zeroed output + one launch; backward: kernel.grad on aliases
    td.torch.function         the torch.library operator (eager)
    td.torch.function, compiled   the same inside torch.compile(backend="aot_eager", fullgraph=True)

for a forward under no_grad, and a forward+backward. First calls (compile) are printed apart.

    python bench/torch_overhead.py
"""
import os
import pathlib
import runpy
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle threads otherwise spin beside Taichi's

import taichi as ti  # noqa: E402
import torch  # noqa: E402

example = runpy.run_path(str(pathlib.Path(__file__).parents[1] / "examples" / "rwkv_operator.py"), run_name="bench")
kernel, EPS = example["rwkv_conv_kernel"], example["EPS"]


class Plain(torch.autograd.Function):
    """What one writes by hand: the kernel forward, Taichi's kernel.grad backward (no forward AD, no compile)."""

    @staticmethod
    def forward(ctx, k, w):
        out = torch.zeros_like(k)
        kernel(k, w, out, EPS)
        ctx.save_for_backward(k, w)
        return out

    @staticmethod
    def backward(ctx, g):
        k, w = ctx.saved_tensors
        ka, wa, out = k.detach().requires_grad_(), w.detach().requires_grad_(), torch.zeros_like(k).requires_grad_()
        ka.grad, wa.grad, out.grad = torch.zeros_like(k), torch.zeros_like(w), g.clone()
        kernel.grad(ka, wa, out, EPS)
        return ka.grad, wa.grad


def rounds(cases, number, repeats):
    samples = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            samples[name].append((time.perf_counter() - t0) / number)
    return {name: statistics.median(s) for name, s in samples.items()}


def main():
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR)
    report()


def report():
    """Print the rows (Taichi initialized by the caller: bench/rwkv.py prints them after W5)."""
    op = example["rwkv_conv"]
    compiled = torch.compile(lambda k, w: op(k, w), backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 4, 8, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(4, 1, 8, dtype=torch.float64, generator=g).requires_grad_()
    cot = torch.randn(1, 4, 8, dtype=torch.float64, generator=g)
    impls = {"plain autograd.Function": Plain.apply, "td.torch.function": op, "td.torch.function, compiled": compiled}

    def forward(f):
        def run():
            with torch.no_grad():
                f(k, w)
        return run

    def forward_backward(f):
        def run():
            k.grad = w.grad = None
            f(k, w).backward(cot)
        return run

    print(f"td.torch.function call overhead (RWKV kernel at (1, 4, 8), float64; torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}):")
    for name, f in impls.items():
        t0 = time.perf_counter()
        forward_backward(f)()
        first = time.perf_counter() - t0
        torch.testing.assert_close(f(k, w), example["rwkv_conv_torch"](k, w), rtol=1e-12, atol=1e-12)
        print(f"first call (compile) of {name}: {first * 1e3:.0f} ms")
    for label, make in (("forward (no_grad)", forward), ("forward+backward", forward_backward)):
        times = rounds({name: make(f) for name, f in impls.items()}, number=50, repeats=15)
        base = times["plain autograd.Function"]
        for name, t in times.items():
            print(f"{label:18} {name:30} {t * 1e6:9.1f} µs   x{t / base:.2f}")


if __name__ == "__main__":
    sys.exit(main())
