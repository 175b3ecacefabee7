"""In-kernel use: a generated kernel calls a transform of the program per element over ndarrays.

The kernel reads each argument (and tangent) from an ndarray of per-element
values, calls the transform exactly as on the host (``td.grad(f, argnums=1)(a0[b], a1[b])``,
``td.jvp(f, (a0[b],), (u0[b],))``), and writes each leaf of the result to an
output ndarray; inside kernels a leaf with more than two dims is a flat
vector (docs/limits.md). The result must equal the host call's.
"""
from __future__ import annotations

import numpy as np
import taichi as ti

import tidiff as td

from . import oracle
from .cases import Case
from .compare import assert_values_close
from .render_taichi import compile_text


def _ndarray(core: tuple) -> str:
    if core == ():
        return "ti.types.ndarray(dtype=ti.f64, ndim=1)"
    if len(core) == 1:
        return f"ti.types.ndarray(dtype=ti.types.vector({core[0]}, ti.f64), ndim=1)"
    if len(core) == 2:
        return f"ti.types.ndarray(dtype=ti.types.matrix({core[0]}, {core[1]}, ti.f64), ndim=1)"
    return f"ti.types.ndarray(dtype=ti.types.vector({int(np.prod(core))}, ti.f64), ndim=1)"


def _paths(tree, path=()):
    if isinstance(tree, tuple):
        return [p for k, t in enumerate(tree) for p in _paths(t, path + (k,))]
    return [path]


def _pick(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def kernel_source(call: str, arg_cores: list, leaf_cores: list, paths: list) -> str:
    """A kernel ``run(a0, ..., u0, ..., o0, ...)`` applying ``call`` per element (``{a0}`` etc. in ``call``)."""
    ins = [f"a{k}: {_ndarray(c)}" for k, c in enumerate(arg_cores)]
    outs = [f"o{k}: {_ndarray(c)}" for k, c in enumerate(leaf_cores)]
    lines = ["@ti.kernel", f"def run({', '.join(ins + outs)}):", "    for b in range(a0.shape[0]):",
             f"        r = {call}"]
    for k, path in enumerate(paths):
        lines.append(f"        o{k}[b] = r" + "".join(f"[{i}]" for i in path))
    return "\n".join(lines) + "\n"


def check_in_kernel(case: Case, call: str, host_call, extra: list | None = None) -> None:
    """Run ``call`` per element inside a kernel and compare with ``host_call(*arrays)`` on the host.

    ``call`` spells the transform with ``{args}`` for the per-element
    arguments and ``{extra}`` for the per-element extra arrays (tangents);
    ``host_call`` takes the flattened host arrays (arguments, then extra).
    """
    extra = extra or []
    cores = case.cores * (1 + bool(extra))
    batch, full = oracle.broadcast_all(case.arrays + extra, cores)
    B = int(np.prod(batch))
    flat = [np.ascontiguousarray(a.reshape((B,) + c)) for a, c in zip(full, cores)]
    n = case.nargs
    per_element = [f"a{k}[b]" for k in range(len(flat))]
    text = call.format(args=", ".join(per_element[:n]), extra=", ".join(per_element[n:]))
    with case.checking(f"inside a kernel: {text}"):
        host = host_call(*flat)
        paths = _paths(host)
        leaves = [np.asarray(_pick(host, p)) for p in paths]
        leaf_cores = [leaf.shape[1:] for leaf in leaves]
        source = kernel_source(text, cores, leaf_cores, paths)
        case.notes.append("kernel:\n" + source)
        ns = {"ti": ti, "td": td, "f": case.f}
        run = compile_text(source, "run", ns, "kernel")
        outs = [np.zeros((B,) + (c if len(c) <= 2 else (int(np.prod(c)),))) for c in leaf_cores]
        run(*flat, *outs)
        for k, (got, want) in enumerate(zip(outs, leaves)):
            assert_values_close(got.reshape(want.shape), want, f"in-kernel leaf {paths[k]} against the host",
                                rtol=1e-12, atol=1e-12)


def plain_values(case: Case) -> list:
    """``f`` per element in a plain kernel, without tidiff: the leaves of its value, each ``batch + leaf``.

    The oracle for classifying a value mismatch: where Taichi's own evaluation disagrees with the torch twin
    too, the fault is not tidiff's (NOTE: [Taichi pitfalls] in ``checks``).
    """
    batch, full = oracle.broadcast_all(case.arrays, case.cores)
    B = int(np.prod(batch))
    flat = [np.ascontiguousarray(a.reshape((B,) + c)) for a, c in zip(full, case.cores)]
    shapes = case.out_shapes
    paths = [()] if len(shapes) == 1 else [(k,) for k in range(len(shapes))]
    text = "f(" + ", ".join(f"a{k}[b]" for k in range(case.nargs)) + ")"
    ns = {"ti": ti, "td": td, "f": case.f}
    run = compile_text(kernel_source(text, case.cores, list(shapes), paths), "run", ns, "plain")
    outs = [np.zeros((B,) + (c if len(c) <= 2 else (int(np.prod(c)),))) for c in shapes]
    run(*flat, *outs)
    return [o.reshape(batch + c) for o, c in zip(outs, shapes)]
