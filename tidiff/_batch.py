"""One kernel launch over a whole batch: a ``@ti.func`` mapped over ndarrays.

:class:`BatchKernel` generates, once per body, a kernel whose parallel loop
calls the body on element ``i`` of every argument and stores its results.
Arguments are ndarrays of shape ``(n_k,) + core``; a broadcast argument is
passed once (``n_k == 1``) with stride 0, so NumPy broadcasting costs no copy.
Kernels over ndarrays compile per dtype and ndim, never per batch size.
"""
import numpy as np
import taichi as ti

from ._codegen import compile_source
from ._signature import ArgSpec

_DTYPE_NAMES = {"f64": np.float64, "f32": np.float32, "i32": np.int32, "i64": np.int64}


class _OutputRecorder:
    """Called inside a probe kernel at compile time; records the body's result types."""

    _is_taichi_function = True  # keeps Taichi from warning about a Python call

    class func:
        has_print = False

    def __init__(self):
        self.specs = None
        self.is_tuple = False

    def __call__(self, result):
        self.is_tuple = isinstance(result, (tuple, list))
        values = list(result) if self.is_tuple else [result]
        self.specs = [spec_of_expr(f"out{i}" if self.is_tuple else "out", v) for i, v in enumerate(values)]


def spec_of_expr(name, value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        dtype = np.float64 if isinstance(value, float) else np.int32
        return ArgSpec(name, (), np.dtype(dtype))
    ty = value.ptr.get_rvalue_type()
    if value.ptr.is_tensor():
        return ArgSpec(name, tuple(value.get_shape()), np.dtype(_DTYPE_NAMES[ty.element_type().to_string()]))
    return ArgSpec(name, (), np.dtype(_DTYPE_NAMES[ty.to_string()]))


def _ndarray_annotation(spec):
    return f"ti.types.ndarray(dtype={_type_expr(spec)}, ndim=1)"


def kernel_shape(spec):
    """The shape one element has in a kernel: rank above 2 is flattened (see NOTE: [Flat values])."""
    return spec.shape if len(spec.shape) <= 2 else (spec.size,)


def _type_expr(spec):
    scalar = f"ti.{spec.dtype.name.replace('float', 'f').replace('int', 'i')}"
    shape = kernel_shape(spec)
    if shape == ():
        return scalar
    if len(shape) == 1:
        return f"ti.types.vector({shape[0]}, {scalar})"
    return f"ti.types.matrix({shape[0]}, {shape[1]}, {scalar})"


def probe_in_kernel(body, in_specs):
    """Result specs of ``body`` read while a kernel compiles: call it on zeros (dead code, removed).

    A kernel cannot launch another, so inside one this replaces :func:`probe_outputs`.
    """
    recorder = _OutputRecorder()
    recorder(body(*[_zero_expr(s) for s in in_specs]))
    return recorder.specs, recorder.is_tuple


def _zero_expr(spec):
    dtype = getattr(ti, spec.dtype.name.replace("float", "f").replace("int", "i"))
    shape = kernel_shape(spec)
    if shape == ():
        return ti.cast(0, dtype)
    if len(shape) == 1:
        return ti.Vector([0] * shape[0], dt=dtype)
    return ti.Matrix([[0] * shape[1] for _ in range(shape[0])], dt=dtype)


def probe_outputs(body, in_specs, name):
    """Learn the result specs of an unannotated body by compiling it once.

    Returns ``(specs, is_tuple, kernel)``; the kernel is returned so its
    compile is counted.
    """
    recorder = _OutputRecorder()
    params = ", ".join(f"a{k}: {_ndarray_annotation(s)}" for k, s in enumerate(in_specs))
    call = ", ".join(f"a{k}[0]" for k in range(len(in_specs)))
    source = f"@ti.kernel\ndef {name}__probe({params}):\n    _record({name}({call}))\n"
    kernel = compile_source(source, f"{name}__probe", {"ti": ti, name: body, "_record": recorder}, "probe")
    kernel(*[np.zeros((1,) + kernel_shape(s), s.dtype) for s in in_specs])
    return recorder.specs, recorder.is_tuple, kernel


class BatchKernel:
    """A generated kernel evaluating ``body`` over a batch (see module docstring)."""

    def __init__(self, body, in_specs, out_specs, is_tuple, name):
        self.in_specs = list(in_specs)
        self.out_specs = list(out_specs)
        self.is_tuple = is_tuple
        self.kernel = compile_source(self._source(name), f"{name}__batch", {"ti": ti, name: body}, "batch")

    def _source(self, name):
        params = ["n: ti.i32"]
        for k, spec in enumerate(self.in_specs):
            params += [f"a{k}: {_ndarray_annotation(spec)}", f"s{k}: ti.i32"]
        params += [f"o{j}: {_ndarray_annotation(s)}" for j, s in enumerate(self.out_specs)]
        call = ", ".join(f"a{k}[i * s{k}]" for k in range(len(self.in_specs)))
        lines = [
            "@ti.kernel",
            f"def {name}__batch({', '.join(params)}):",
            "    for i in range(n):",
            f"        r = {name}({call})",
        ]
        if self.is_tuple:
            lines += [f"        o{j}[i] = r[{j}]" for j in range(len(self.out_specs))]
        else:
            lines += ["        o0[i] = r"]
        return "\n".join(lines) + "\n"

    def launch_args(self, n, inputs, outputs):
        """Kernel arguments for ``n`` elements: each input with its stride (0 = broadcast)."""
        args = [n]
        for a in inputs:
            args += [a, 0 if a.shape[0] == 1 else 1]
        return args + list(outputs)

    def __call__(self, n, inputs):
        """Evaluate over ``n`` elements; ``inputs`` are ``(n or 1,) + core`` arrays."""
        outputs = [np.empty((n,) + kernel_shape(s), s.dtype) for s in self.out_specs]
        if n:
            self.kernel(*self.launch_args(n, inputs, outputs))
        return [o.reshape((n,) + s.shape) for o, s in zip(outputs, self.out_specs)]


class ScalarKernel:
    """One call of a scalar body on scalars, by value: a kernel returning the result.

    A call with no batch dims pays for one plain launch instead of a
    parallel loop over one-element arrays (see NOTE: [Scalar calls] in
    ``_pointwise``).
    """

    def __init__(self, body, in_specs, out_spec, name):
        self.out_spec = out_spec
        params = ", ".join(f"a{k}: {_type_expr(s)}" for k, s in enumerate(in_specs))
        call = ", ".join(f"a{k}" for k in range(len(in_specs)))
        source = f"@ti.kernel\ndef {name}__one({params}) -> {_type_expr(out_spec)}:\n    return {name}({call})\n"
        self.kernel = compile_source(source, f"{name}__one", {"ti": ti, name: body}, "one")

    @staticmethod
    def fits(in_specs, out_specs, is_tuple):
        return not is_tuple and all(s.shape == () for s in list(in_specs) + list(out_specs))

    def __call__(self, inputs):
        return [np.asarray(self.kernel(*[a.item() for a in inputs]), self.out_spec.dtype)]


def flatten_batch(arrays, specs, batch_shape):
    """Arrays of shape ``(n_k,) + core`` for a kernel: batch dims flattened, broadcast kept cheap.

    An argument whose batch dims are all 1 (or absent) is passed as one
    element; one partly broadcast is expanded to the full batch.
    """
    n = int(np.prod(batch_shape, dtype=np.int64))
    flat = []
    for a, s in zip(arrays, specs):
        batch = a.shape[: a.ndim - len(s.shape)]
        if int(np.prod(batch, dtype=np.int64)) == 1:
            a = a.reshape((1,) + s.shape)
        elif batch != batch_shape:
            a = np.broadcast_to(a, batch_shape + s.shape).reshape((n,) + s.shape)
        else:
            a = a.reshape((n,) + s.shape)
        flat.append(np.ascontiguousarray(a).reshape((a.shape[0],) + kernel_shape(s)))
    return n, flat
