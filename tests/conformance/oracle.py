"""The torch oracle: JAX's transforms rebuilt from ``torch.autograd.functional`` in float64.

A *twin* takes one batch element (tensors of the core shapes) and returns a
tensor or a tuple. The transforms here map twins to twins, with
``create_graph=True`` so they compose to any order, exactly as tidiff's
transforms compose; :func:`per_element` then applies a twin to every batch
element (as ``vmap`` of the transform would: grad, jac*, hessian, hvp), and
:func:`batched` makes the whole-batch function whose ``jvp``/``vjp`` torch
takes (a broadcast argument's tangent reaches every element and its
cotangent is summed over the batch, as NumPy broadcasting does).

NOTE: [Oracle per element] torch.func.vmap(hessian) is wrong through
torch.linalg.det in torch 2.13 (DESIGN.md), so per-element results come from
a Python loop over the elements; batches are kept small for that reason.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

F64 = torch.float64


# -- tuples as trees ---------------------------------------------------------------------------


def leaves(tree: Any) -> list:
    if isinstance(tree, (tuple, list)):
        return [leaf for t in tree for leaf in leaves(t)]
    return [tree]


def tree_map(fn: Callable, tree: Any) -> Any:
    if isinstance(tree, (tuple, list)):
        return tuple(tree_map(fn, t) for t in tree)
    return fn(tree)


def tree_stack(trees: Sequence[Any], batch: tuple) -> Any:
    """Stack per-element trees of tensors into a tree of NumPy arrays shaped ``batch + leaf``."""
    first = trees[0]
    if isinstance(first, (tuple, list)):
        return tuple(tree_stack([t[k] for t in trees], batch) for k in range(len(first)))
    values = np.stack([np.asarray(t.detach().numpy() if isinstance(t, torch.Tensor) else t, dtype=np.float64)
                       for t in trees])
    return values.reshape(batch + values.shape[1:])


# -- argnums -----------------------------------------------------------------------------------


def positions(argnums: int | tuple, nargs: int) -> tuple:
    """Argument positions of ``argnums`` (negatives count from the end), in its order."""
    return tuple(k % nargs for k in (argnums if isinstance(argnums, tuple) else (argnums,)))


def _replace(args: Sequence, where: tuple, values: Sequence) -> list:
    full = list(args)
    for k, v in zip(where, values):
        full[k] = v
    return full


# -- transforms of twins -----------------------------------------------------------------------


def jac(twin: Callable, argnums: int | tuple = 0, forward: bool = False) -> Callable:
    """The Jacobian twin, nested as JAX nests it (outputs outer, arguments inner); grad of a scalar twin.

    By torch's reverse mode (``torch.autograd.functional.jacobian``, differentiable again), or with
    ``forward`` by its forward mode (``torch.func.jacfwd``, which nests only with itself).
    """
    def jacobian_twin(*args):
        where = positions(argnums, len(args))

        def of_selected(*xs):
            return twin(*_replace(args, where, xs))

        def flat(*xs):
            out = of_selected(*xs)
            return tuple(leaves(out)) if isinstance(out, tuple) else out

        if forward:
            nums = tuple(range(len(where))) if isinstance(argnums, tuple) else 0
            result = torch.func.jacfwd(flat, argnums=nums)(*[args[k] for k in where])
        else:
            inputs = tuple(args[k] for k in where) if isinstance(argnums, tuple) else args[where[0]]
            with torch.enable_grad():
                result = torch.autograd.functional.jacobian(flat, inputs, create_graph=True)
        structure = of_selected(*[args[k] for k in where])
        return _unflatten(structure, list(result)) if isinstance(structure, tuple) else result
    return jacobian_twin


def _unflatten(structure: Any, flat: list) -> Any:
    """``flat`` (one entry per leaf of ``structure``, in order) nested as ``structure`` is."""
    if isinstance(structure, tuple):
        return tuple(_unflatten(s, flat) for s in structure)
    return flat.pop(0)


def main_output(twin: Callable) -> Callable:
    """``out`` of a twin returning ``(out, aux)``."""
    return lambda *args: twin(*args)[0]


def with_aux(transformed: Callable, twin: Callable) -> Callable:
    """``(transformed(*args), aux)``: how every JAX transform returns aux."""
    return lambda *args: (transformed(*args), twin(*args)[1])


def value_and_grad(twin: Callable, argnums: int | tuple, has_aux: bool) -> Callable:
    main = main_output(twin) if has_aux else twin
    return lambda *args: (twin(*args), jac(main, argnums)(*args))


def hvp_elementwise(twin: Callable) -> Callable:
    """``(value, H @ t)`` of a scalar twin with respect to all its arguments; args are primals then tangents."""
    def hvp_twin(*args):
        n = len(args) // 2
        with torch.enable_grad():
            value, hv = torch.autograd.functional.hvp(twin, tuple(args[:n]), tuple(args[n:]), create_graph=True)
        return value, tuple(hv)
    return hvp_twin


# -- applying twins to batches ------------------------------------------------------------------


def broadcast_all(arrays: Sequence[np.ndarray], cores: Sequence[tuple]) -> tuple[tuple, list]:
    """The batch shape of host arguments, and each argument broadcast to ``batch + core``."""
    batch = np.broadcast_shapes(*[np.shape(a)[: np.ndim(a) - len(c)] for a, c in zip(arrays, cores)])
    return batch, [np.broadcast_to(a, batch + c) for a, c in zip(arrays, cores)]


def per_element(twin: Callable, arrays: Sequence[np.ndarray], cores: Sequence[tuple]) -> Any:
    """Apply a twin to every batch element; NumPy arrays shaped ``batch + leaf``."""
    batch, full = broadcast_all(arrays, cores)
    results = []
    for idx in np.ndindex(*batch):
        results.append(twin(*[torch.tensor(np.array(a[idx]), dtype=F64) for a in full]))
    if not results:
        raise ValueError("an empty batch has no elements to compare")
    return tree_stack(results, batch)


def batched(twin: Callable, cores: Sequence[tuple]) -> Callable:
    """The whole-batch function of host-shaped tensors: broadcast, loop over elements, stack."""
    def whole(*tensors):
        batch = torch.broadcast_shapes(*[t.shape[: t.dim() - len(c)] for t, c in zip(tensors, cores)])
        full = [torch.broadcast_to(t, tuple(batch) + c) for t, c in zip(tensors, cores)]
        outs = [twin(*[a[idx] for a in full]) for idx in np.ndindex(*batch)]

        def stack(k_path):
            def pick(tree):
                for k in k_path:
                    tree = tree[k]
                return tree
            values = torch.stack([pick(o) for o in outs])
            return values.reshape(tuple(batch) + values.shape[1:])

        if isinstance(outs[0], tuple):
            return tuple(stack((k,)) for k in range(len(outs[0])))
        return stack(())
    return whole


def tensors(arrays: Sequence[Any]) -> tuple:
    return tuple(torch.tensor(np.array(a), dtype=F64) for a in arrays)


def jvp(twin: Callable, cores: Sequence[tuple], primals: Sequence, tangents: Sequence) -> tuple:
    """``(out, tangent_out)`` of the whole batched twin, as NumPy trees."""
    out, tout = torch.autograd.functional.jvp(batched(twin, cores), tensors(primals), tensors(tangents))
    return tree_map(_numpy, out), tree_map(_numpy, tout)


def vjp(twin: Callable, cores: Sequence[tuple], primals: Sequence, cotangent: Any) -> tuple:
    """``(out, cotangents of the primals)`` of the whole batched twin, as NumPy trees."""
    ct = tree_map(lambda c: torch.tensor(np.array(c), dtype=F64), cotangent)
    out, grads = torch.autograd.functional.vjp(batched(twin, cores), tensors(primals), ct)
    return tree_map(_numpy, out), tree_map(_numpy, grads)


def forward_cotangents(twin: Callable, cores: Sequence[tuple], primals: Sequence, cotangent: Any) -> tuple:
    """``J^T c`` of the whole batched twin by torch's forward mode: entry k is ``<J e_k, c>``, one
    ``torch.func.jvp`` per input component (no vmap, so the twin's branches on values run as they are)."""
    whole, xs = batched(twin, cores), tensors(primals)
    cts = [torch.tensor(np.array(c), dtype=F64) for c in leaves(cotangent)]
    result = []
    for i, x in enumerate(xs):
        entries = []
        for k in range(x.numel()):
            basis = [torch.zeros_like(y) for y in xs]
            basis[i].view(-1)[k] = 1.0
            _, tout = torch.func.jvp(whole, xs, tuple(basis))
            entries.append(sum(float((t * c).sum()) for t, c in zip(leaves(tout), cts, strict=True)))
        result.append(np.array(entries).reshape(x.shape))
    return tuple(result)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()
