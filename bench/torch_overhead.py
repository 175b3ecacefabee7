"""Call overhead of td.torch.function operators against plain torch.autograd.Functions (issues 14 and 40).

Part 1, the RWKV kernel against a Function calling the same kernel and its kernel.grad:

The kernel is the RWKV ndarray kernel of examples/rwkv_operator.py at a tiny size (1, 4, 8), so
that a call costs little more than its launches. Rows, per call (median of rounds, round-robin):

    plain autograd.Function   forward: zeroed output + one launch; backward: kernel.grad on aliases
    td.torch.function         the torch.library operator (eager)
    td.torch.function, compiled   the same inside torch.compile(backend="aot_eager", fullgraph=True)

for a forward under no_grad, and a forward+backward. First calls (compile) are printed apart.

Part 2, the seeds' linear layer ``tanh(x @ W.T + b)`` (8 -> 4) at 16 and 100,000 rows, float64:

    hand-written autograd.Function   a Taichi forward kernel and a hand-derived backward kernel, as users write it
    td.torch.function, ndarray      the forward kernel alone (backward: tidiff's adjoint of it)
    td.torch.function, @ti.func     one row as a @ti.func (W and b broadcast)

the td operators eager and inside torch.compile(backend="aot_eager", fullgraph=True), the @ti.func one under
inductor too (dynamo cannot trace the hand-written Function, which enters Taichi), and the layer in torch alone
eager and compiled (what compiling costs with no Taichi in it); ratios to the eager hand-written one.

Part 3, eight of those layers in one model (their sum), 16 rows: per operator, eager, compiled (aot_eager,
inductor), compiled by a backend running dynamo's graph as it is, and that graph run alone, without
torch.compile's entry (what the compiled model's operators cost by themselves); ratios to the same model eager.

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


IN, OUT = 8, 4


@ti.kernel
def linear_forward(x: ti.types.ndarray(), W: ti.types.ndarray(), b: ti.types.ndarray(), y: ti.types.ndarray()):
    for i, j in y:
        acc = b[j]
        for k in range(x.shape[1]):
            acc += x[i, k] * W[j, k]
        y[i, j] = ti.tanh(acc)


@ti.kernel
def linear_backward(x: ti.types.ndarray(), W: ti.types.ndarray(), y: ti.types.ndarray(), gy: ti.types.ndarray(),
                    gx: ti.types.ndarray(), gW: ti.types.ndarray(), gb: ti.types.ndarray()):
    for i, k in gx:
        acc = 0.0
        for j in range(W.shape[0]):
            acc += gy[i, j] * (1.0 - y[i, j] ** 2) * W[j, k]
        gx[i, k] = acc
    for j, k in gW:
        acc = 0.0
        for i in range(x.shape[0]):
            acc += gy[i, j] * (1.0 - y[i, j] ** 2) * x[i, k]
        gW[j, k] = acc
    for j in gb:
        acc = 0.0
        for i in range(x.shape[0]):
            acc += gy[i, j] * (1.0 - y[i, j] ** 2)
        gb[j] = acc


class HandLinear(torch.autograd.Function):
    """The seeds' layer as users write it: a forward kernel and a hand-derived backward kernel."""

    @staticmethod
    def forward(ctx, x, W, b):
        y = torch.empty(x.shape[0], W.shape[0], dtype=x.dtype)
        linear_forward(x.detach(), W.detach(), b.detach(), y)
        ctx.save_for_backward(x, W, y)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, W, y = ctx.saved_tensors
        gx, gW, gb = torch.empty_like(x), torch.empty_like(W), torch.empty(W.shape[0], dtype=W.dtype)
        linear_backward(x.detach(), W.detach(), y.detach(), gy.contiguous(), gx, gW, gb)
        return gx, gW, gb


@ti.func
def linear_row(x: ti.types.vector(IN, ti.f64), W: ti.types.matrix(OUT, IN, ti.f64),
               b: ti.types.vector(OUT, ti.f64)) -> ti.types.vector(OUT, ti.f64):
    return ti.tanh(W @ x + b)


def linear_report():
    import tidiff as td

    ndarray_op = td.torch.function(linear_forward, inputs=["x", "W", "b"],
                                   outputs={"y": lambda x, W, b: (x.shape[0], W.shape[0])})
    func_op = td.torch.function(linear_row)
    eager = {"hand-written autograd.Function": HandLinear.apply, "td.torch.function, ndarray": ndarray_op,
             "td.torch.function, @ti.func": func_op}
    impls = dict(eager)
    for name, f in list(eager.items())[1:]:  # the hand-written Function cannot be traced (dynamo enters Taichi)
        impls[name + ", compiled"] = torch.compile(lambda x, W, b, f=f: f(x, W, b), backend="aot_eager",
                                                   fullgraph=True)

    def in_torch(x, W, b):
        return torch.tanh(x @ W.T + b)

    # what torch.compile costs a layer with no Taichi in it: the floor under the compiled rows
    impls["torch alone (no Taichi)"] = in_torch
    impls["torch alone (no Taichi), compiled"] = torch.compile(in_torch, backend="aot_eager", fullgraph=True)
    impls["td.torch.function, @ti.func, inductor"] = torch.compile(lambda x, W, b: func_op(x, W, b),
                                                                   backend="inductor", fullgraph=True)
    impls["torch alone (no Taichi), inductor"] = torch.compile(in_torch, backend="inductor", fullgraph=True)
    print(f"\nthe seeds' linear layer tanh(x @ W.T + b), {IN} -> {OUT}, float64:")
    for rows in (16, 100_000):
        g = torch.Generator().manual_seed(rows)
        x = torch.randn(rows, IN, dtype=torch.float64, generator=g).requires_grad_()
        W = torch.randn(OUT, IN, dtype=torch.float64, generator=g).requires_grad_()
        b = torch.randn(OUT, dtype=torch.float64, generator=g).requires_grad_()
        cot = torch.randn(rows, OUT, dtype=torch.float64, generator=g)
        want_y = torch.tanh(x @ W.T + b)
        want = torch.autograd.grad(want_y, (x, W, b), cot)
        for f in impls.values():  # first calls compile; every contender checked against torch
            y = f(x, W, b)
            torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)
            for got, ref in zip(torch.autograd.grad(y, (x, W, b), cot), want, strict=True):
                torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)

        def forward(f, x=x, W=W, b=b):
            def run():
                with torch.no_grad():
                    f(x, W, b)
            return run

        def forward_backward(f, x=x, W=W, b=b, cot=cot):
            def run():
                x.grad = W.grad = b.grad = None
                f(x, W, b).backward(cot)
            return run

        number, repeats = (50, 15) if rows < 1000 else (3, 7)
        for label, make in (("forward (no_grad)", forward), ("forward+backward", forward_backward)):
            times = rounds({name: make(f) for name, f in impls.items()}, number=number, repeats=repeats)
            base = times["hand-written autograd.Function"]
            for name, t in times.items():
                print(f"{rows:>7} rows {label:18} {name:42} {t * 1e6:10.1f} µs   x{t / base:.2f}")


LAYERS = 8


def stacked_report():
    """Part 3: what compiling costs per operator once a graph holds several: the model eager, compiled (aot_eager,
    inductor), compiled by a backend that runs dynamo's graph as it is, and that graph run alone (the operators
    as the compiled model calls them, without torch.compile's entry: frame, guards, wrappers)."""
    import tidiff as td

    ndarray_op = td.torch.function(linear_forward, inputs=["x", "W", "b"],
                                   outputs={"y": lambda x, W, b: (x.shape[0], W.shape[0])})
    func_op = td.torch.function(linear_row)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, IN, dtype=torch.float64, generator=g).requires_grad_()
    Ws = [torch.randn(OUT, IN, dtype=torch.float64, generator=g).requires_grad_() for _ in range(LAYERS)]
    bs = [torch.randn(OUT, dtype=torch.float64, generator=g).requires_grad_() for _ in range(LAYERS)]
    cot = torch.randn(16, OUT, dtype=torch.float64, generator=g)

    def model(layer):
        def run(x, Ws, bs):
            return sum(layer(x, W, b) for W, b in zip(Ws, bs, strict=True))  # LAYERS operators, their sum
        return run

    def in_torch(x, W, b):
        return torch.tanh(x @ W.T + b)

    def kept_by(graphs, label):
        """A torch.compile backend that runs dynamo's graph as it is, kept to be run without the compiled entry."""
        def backend(gm, example_inputs):
            graphs[label] = (gm, list(example_inputs))  # the caller's own tensors, in the graph's order
            return gm.forward
        return backend

    torch._dynamo.config.recompile_limit = 64  # nine compiled models share run's code object, each in two modes
    models, eager_of, graphs = {}, {}, {}  # eager_of: a model -> the eager one it is compared with
    for label, layer in (("td.torch.function, ndarray", ndarray_op), ("td.torch.function, @ti.func", func_op),
                         ("torch alone (no Taichi)", in_torch)):
        models[label] = model(layer)
        for backend, suffix in (("aot_eager", "compiled"), ("inductor", "inductor"), (kept_by(graphs, label),
                                                                                        "dynamo's graph")):
            models[f"{label}, {suffix}"] = torch.compile(model(layer), backend=backend, fullgraph=True)
            eager_of[f"{label}, {suffix}"] = label
        models[f"{label}, {suffix}"](x, Ws, bs)  # keeps dynamo's graph: run alone, it is the ops without the entry
        models[f"{label}, graph alone"] = lambda x, Ws, bs, label=label: graphs[label][0].forward(*graphs[label][1])[0]
        eager_of[f"{label}, graph alone"] = label
    want = models["torch alone (no Taichi)"](x, Ws, bs)
    for f in models.values():  # first calls compile; every model checked against torch
        torch.testing.assert_close(f(x, Ws, bs), want, rtol=1e-12, atol=1e-12)

    def forward(f):
        def run():
            with torch.no_grad():
                f(x, Ws, bs)
        return run

    def forward_backward(f):
        def run():
            x.grad = None
            for p in (*Ws, *bs):
                p.grad = None
            f(x, Ws, bs).backward(cot)
        return run

    print(f"\n{LAYERS} of the linear layers in one model (their sum), 16 rows, float64; per operator, and "
          "compiled against the same model eager:")
    for label, make in (("forward (no_grad)", forward), ("forward+backward", forward_backward)):
        times = rounds({name: make(f) for name, f in models.items()}, number=20, repeats=15)
        for name, t in times.items():
            eager = times[eager_of.get(name, name)]
            print(f"{label:18} {name:42} {t / LAYERS * 1e6:8.1f} µs per operator   x{t / eager:.2f} of eager")


def main():
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR)
    report()
    linear_report()
    stacked_report()


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
