"""Reverse engine for ``@ti.func`` bodies: Taichi's ``kernel.grad`` over a batch.

NumPy arrays have no gradient buffers, so the reverse pass runs on
``ti.ndarray`` storage with ``needs_grad``. Storage is kept for the most
recent shapes only: memory stays bounded however many batch sizes are used.
A broadcast input (stride 0) gets its cotangent summed over the batch by the
adjoint's atomic adds, as NumPy broadcasting reversed requires.
"""
import numpy as np
import taichi as ti

from ._batch import kernel_shape


class _Storage:
    """ti.ndarrays (with gradients for float values) for one set of shapes."""

    def __init__(self, in_specs, in_sizes, out_specs, n):
        self.inputs = [self._alloc(s, m) for s, m in zip(in_specs, in_sizes)]
        self.outputs = [self._alloc(s, n) for s in out_specs]

    @staticmethod
    def _alloc(spec, m):
        flat = spec.__class__(spec.name, kernel_shape(spec), spec.dtype)
        return ti.ndarray(flat.ti_type(), shape=(m,), needs_grad=spec.is_float)


class ReverseEngine:
    """vjp of a :class:`~tidiff._batch.BatchKernel` over a whole batch."""

    def __init__(self, batch_kernel):
        self.batch = batch_kernel
        self._storage_key = None
        self._storage = None

    def _storage_for(self, n, inputs):
        key = (n,) + tuple(a.shape[0] for a in inputs)
        if key != self._storage_key:
            self._storage = None  # free the old buffers before allocating new ones
            self._storage = _Storage(self.batch.in_specs, key[1:], self.batch.out_specs, n)
            self._storage_key = key
        return self._storage

    def vjp(self, n, inputs, cotangents):
        """Outputs and input cotangents; ``cotangents`` are ``(n,) + out_core`` arrays (None = zero).

        Returns ``(outputs, grads)`` with ``grads[k]`` shaped like ``inputs[k]``
        (``None`` for integer inputs).
        """
        store = self._storage_for(n, inputs)
        for buf, a in zip(store.inputs, inputs):
            buf.from_numpy(a)
            if buf.grad is not None:
                buf.grad.fill(0)
        args = self.batch.launch_args(n, store.inputs, store.outputs)
        self.batch.kernel(*args)
        outputs = [buf.to_numpy().reshape((n,) + s.shape) for buf, s in zip(store.outputs, self.batch.out_specs)]
        for buf, spec, ct in zip(store.outputs, self.batch.out_specs, cotangents):
            if ct is None:
                buf.grad.fill(0)
            else:
                buf.grad.from_numpy(np.ascontiguousarray(ct, dtype=spec.dtype).reshape((n,) + kernel_shape(spec)))
        self.batch.kernel.grad(*args)
        grads = [
            None if buf.grad is None else buf.grad.to_numpy().reshape(a.shape)
            for buf, a in zip(store.inputs, inputs)
        ]
        return outputs, grads
