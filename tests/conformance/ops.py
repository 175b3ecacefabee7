"""The op table: every op of tidiff's rule tables, with its Taichi spelling, its torch twin and its shapes.

One row per op. ``taichi`` and ``torch`` are format templates over the
rendered operands ``{0}``, ``{1}``, ... and the op's static parameters
(``{i}``, ``{k}``, ``{lo}``); ``shapes(T)`` lists the operand shapes that
give a result of shape ``T`` (empty: the op cannot make a ``T``);
``params(draw, T, operands)`` draws the static parameters. Both renderers
read the same row, so a program and its torch twin cannot drift apart.

NOTE: [Domains] Ops with a restricted domain get operands that are inside
it by construction, spelled identically in both renderers: ``log(a**2 + 1)``,
``sqrt(a**2 + 0.5)``, ``asin(tanh(a) * 0.9)``, ``a / (b**2 + 1)``,
``tan(tanh(a))``, ``exp(tanh(a) * 2)`` (bounded, so nested programs stay
finite), ``inverse(I + 0.25 * tanh(M))`` (row sums below 1: invertible and
well conditioned), ``(v + 0.7391).norm()`` (zero only at a point no
generated expression reaches). Each operand is used once, so nesting does
not double the source.

NOTE: [Kinks] ``smooth=False`` marks ops with a kink, a jump or a zero
derivative almost everywhere (abs, min, max, select, clamp, smoothstep's
second derivative, floor, mod, integer casts). Ties have measure zero with
random inputs, so torch (which picks the same branch) stays an oracle;
finite differences are only used on programs without such ops.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st

VECTOR_SIZES = (1, 2, 3, 4)
MATRIX_SHAPES = ((2, 2), (3, 3), (2, 3), (3, 2))
SHAPES = ((),) + tuple((n,) for n in VECTOR_SIZES) + MATRIX_SHAPES


def is_scalar(shape: tuple) -> bool:
    return shape == ()


def is_vector(shape: tuple) -> bool:
    return len(shape) == 1


def is_matrix(shape: tuple) -> bool:
    return len(shape) == 2


def is_square(shape: tuple) -> bool:
    return is_matrix(shape) and shape[0] == shape[1]


@dataclass(frozen=True)
class Op:
    """One row: how to spell the op in Taichi and in torch, and which shapes it takes and gives."""

    taichi: str
    torch: str
    shapes: Callable[[tuple], list]
    smooth: bool = True
    params: Callable[..., dict] | None = None
    scalar_params: bool = False  # params are floats printed in the templates


# -- shape signatures ---------------------------------------------------------------------------


def same(T):
    return [(T,)]


def elementwise2(T):
    """Two operands of shape T, or one broadcast scalar (Taichi and torch broadcast alike)."""
    return [(T, T)] if T == () else [(T, T), ((), T), (T, ())]


def elementwise3(T):
    return [(T, T, T)] if T == () else [(T, T, T), (T, T, ()), ((), (), T)]


def select_shapes(T):
    return [((), T, T)]


def scalars_only(T):
    return [((),)] if T == () else []


def scalar_pair(T):
    return [((), ())] if T == () else []


def reduce_any(T):
    return [(S,) for S in SHAPES if S != ()] if T == () else []


def reduce_vector(T):
    return [((n,),) for n in VECTOR_SIZES] if T == () else []


def reduce_square(T):
    return [(S,) for S in MATRIX_SHAPES if is_square(S)] if T == () else []


def pair_vectors(T):
    return [((n,), (n,)) for n in VECTOR_SIZES] if T == () else []


def cross2(T):
    return [((2,), (2,))] if T == () else []


def cross3(T):
    return [((3,), (3,))] if T == (3,) else []


def vector_same(T):
    return [(T,)] if is_vector(T) else []


def matvec(T):
    return [((T[0], k), (k,)) for k in (2, 3) if (T[0], k) in MATRIX_SHAPES] if is_vector(T) else []


def matmat(T):
    if not is_matrix(T):
        return []
    return [((T[0], k), (k, T[1])) for k in (2, 3) if (T[0], k) in MATRIX_SHAPES and (k, T[1]) in MATRIX_SHAPES]


def transpose(T):
    return [((T[1], T[0]),)] if is_matrix(T) else []


def outer(T):
    return [((T[0],), (T[1],))] if is_matrix(T) else []


def square_same(T):
    return [(T,)] if is_square(T) else []


def vector_ctor(T):
    return [((),) * T[0]] if is_vector(T) else []


def matrix_ctor(T):
    return [((),) * (T[0] * T[1])] if is_matrix(T) else []


def filled(T):
    """``vec3d(x)``: a scalar in every entry (Taichi's typed constructors of one scalar)."""
    return [((),)] if T != () else []


def typed_copy(T):
    """``vec3d(v)``: a typed constructor of one vector or matrix copies it."""
    return [(T,)] if T != () else []


# -- static parameters --------------------------------------------------------------------------


def entry_params(draw, T, operands):
    (S,) = operands
    if is_vector(S):
        return {"i": draw(st.integers(0, S[0] - 1))}
    return {"i": f"{draw(st.integers(0, S[0] - 1))}, {draw(st.integers(0, S[1] - 1))}"}


def attr_params(draw, T, operands):
    (S,) = operands
    i = draw(st.integers(0, S[0] - 1))
    return {"attr": "xyzw"[i], "i": i}


def exponent(choices):
    def params(draw, T, operands):
        return {"k": draw(st.sampled_from(choices))}
    return params


def clamp_params(draw, T, operands):
    lo = draw(st.sampled_from([-0.8, -0.3, 0.1]))
    return {"lo": lo, "hi": lo + draw(st.sampled_from([0.5, 1.1]))}


def smoothstep_params(draw, T, operands):
    e0 = draw(st.sampled_from([-0.9, -0.2, 0.3]))
    return {"e0": e0, "e1": e0 + draw(st.sampled_from([0.7, 1.6]))}


def threshold_params(draw, T, operands):
    return {"t": draw(st.sampled_from([0.3, -0.2, 0.0]))}


def constant_params(draw, T, operands):
    return {"c": draw(st.sampled_from([1.7, 0.4, -0.6, 2.3]))}


def identity_params(draw, T, operands):
    return {"n": T[0]}


def vector_ctor_params(draw, T, operands):
    return {"n": T[0]}


def matrix_ctor_params(draw, T, operands):
    return {"n": T[0], "m": T[1]}


def type_params(draw, T, operands):
    return {"type": f"vec{T[0]}d" if is_vector(T) else f"mat{T[0]}{T[1]}d", "shape": str(T)}


# -- the table ----------------------------------------------------------------------------------

OPS: dict[str, Op] = {
    # elementwise, one operand
    "neg": Op("(-{0})", "(-{0})", same),
    "scale": Op("({0} * {c})", "({0} * {c})", same, params=constant_params),
    "shift": Op("({0} + {c})", "({0} + {c})", same, params=constant_params),
    "rsub": Op("({c} - {0})", "({c} - {0})", same, params=constant_params),
    "rdiv": Op("({c} / ({0} ** 2 + 1.0))", "({c} / ({0} ** 2 + 1.0))", same, params=constant_params),
    "sin": Op("ti.sin({0})", "torch.sin({0})", same),
    "cos": Op("ti.cos({0})", "torch.cos({0})", same),
    "tan": Op("ti.tan(ti.tanh({0}))", "torch.tan(torch.tanh({0}))", same),
    "asin": Op("ti.asin(ti.tanh({0}) * 0.9)", "torch.asin(torch.tanh({0}) * 0.9)", same),
    "acos": Op("ti.acos(ti.tanh({0}) * 0.9)", "torch.acos(torch.tanh({0}) * 0.9)", same),
    "tanh": Op("ti.tanh({0})", "torch.tanh({0})", same),
    "exp": Op("ti.exp(ti.tanh({0}) * 2.0)", "torch.exp(torch.tanh({0}) * 2.0)", same),
    "log": Op("ti.log({0} ** 2 + 1.0)", "torch.log({0} ** 2 + 1.0)", same),
    "sqrt": Op("ti.sqrt({0} ** 2 + 0.5)", "torch.sqrt({0} ** 2 + 0.5)", same),
    "rsqrt": Op("ti.rsqrt({0} ** 2 + 0.5)", "torch.rsqrt({0} ** 2 + 0.5)", same),
    "pow_int": Op("({0} ** {k})", "({0} ** {k})", same, params=exponent([2, 3, 1, 0])),
    "pow_int_fn": Op("ti.pow({0}, {k})", "({0} ** {k})", same, params=exponent([2, 3])),
    "pow_real": Op("(({0} ** 2 + 0.5) ** {k})", "(({0} ** 2 + 0.5) ** {k})", same,
                   params=exponent([1.5, 0.5, -0.7, 2.5])),
    "pow_real_fn": Op("ti.pow({0} ** 2 + 0.5, {k})", "(({0} ** 2 + 0.5) ** {k})", same,
                      params=exponent([0.7, 1.5])),
    "abs": Op("ti.abs({0})", "torch.abs({0})", same, smooth=False),
    "abs_builtin": Op("abs({0})", "torch.abs({0})", same, smooth=False),
    "floor": Op("ti.floor({0} * 2.0)", "torch.floor({0} * 2.0)", same, smooth=False),
    "mod": Op("({0} % 1.3)", "torch.remainder({0}, 1.3)", same, smooth=False),
    "clamp": Op("ti.math.clamp({0}, {lo}, {hi})", "_clamp({0}, {lo}, {hi})", same, smooth=False,
                params=clamp_params),
    "smoothstep": Op("ti.math.smoothstep({e0}, {e1}, {0})", "_smoothstep({e0}, {e1}, {0})", same, smooth=False,
                     params=smoothstep_params),
    # differences see the function's derivative, not the one stop_gradient defines: no difference oracle
    "stop_gradient": Op("td.stop_gradient({0})", "({0}).detach()", same, smooth=False),
    "cast_f64": Op("ti.cast({0}, ti.f64)", "{0}", same),
    "float": Op("float({0})", "{0}", scalars_only),
    "f64_call": Op("ti.f64({0})", "{0}", scalars_only),
    "int_cast": Op("ti.cast(ti.cast({0} * 2.0, ti.i32), ti.f64)", "torch.trunc({0} * 2.0)", scalars_only,
                   smooth=False),
    # elementwise, several operands
    "add": Op("({0} + {1})", "({0} + {1})", elementwise2),
    "sub": Op("({0} - {1})", "({0} - {1})", elementwise2),
    "mul": Op("({0} * {1})", "({0} * {1})", elementwise2),
    "div": Op("({0} / ({1} ** 2 + 1.0))", "({0} / ({1} ** 2 + 1.0))", elementwise2),
    "min": Op("ti.min({0}, {1})", "_minimum({0}, {1})", elementwise2, smooth=False),
    "max": Op("ti.max({0}, {1})", "_maximum({0}, {1})", elementwise2, smooth=False),
    "min_builtin": Op("min({0}, {1})", "_minimum({0}, {1})", scalar_pair, smooth=False),
    "max_builtin": Op("max({0}, {1})", "_maximum({0}, {1})", scalar_pair, smooth=False),
    # scalars only: Taichi 1.7.4 computes ti.atan2 of vectors and matrices in float32 (relative error 1e-7)
    "atan2": Op("ti.atan2({0}, {1} ** 2 + 0.5)", "torch.atan2({0}, {1} ** 2 + 0.5)", scalar_pair),
    "pow_both": Op("(({0} ** 2 + 0.5) ** ti.tanh({1}))", "(({0} ** 2 + 0.5) ** torch.tanh({1}))", elementwise2),
    "mix": Op("ti.math.mix({0}, {1}, {2})", "_mix({0}, {1}, {2})", elementwise3),
    "select": Op("ti.select({0} > {t}, {1}, {2})", "torch.where({0} > {t}, {1}, {2})", select_shapes,
                 smooth=False, params=threshold_params),
    # reductions to a scalar
    "entry": Op("{0}[{i}]", "{0}[{i}]", reduce_any, params=entry_params),
    "attr": Op("{0}.{attr}", "{0}[{i}]", reduce_vector, params=attr_params),
    "sum": Op("{0}.sum()", "{0}.sum()", reduce_any),
    "max_of": Op("{0}.max()", "_max_of({0})", reduce_any, smooth=False),
    "min_of": Op("{0}.min()", "_min_of({0})", reduce_any, smooth=False),
    "dot": Op("{0}.dot({1})", "torch.dot({0}, {1})", pair_vectors),
    "dot_fn": Op("ti.math.dot({0}, {1})", "torch.dot({0}, {1})", pair_vectors),
    "norm_sqr": Op("{0}.norm_sqr()", "_norm_sqr({0})", reduce_any),  # of a matrix too: Frobenius's
    "norm": Op("({0} + 0.7391).norm()", "_norm({0} + 0.7391)", reduce_any),
    "length": Op("ti.math.length({0} + 0.7391)", "_norm({0} + 0.7391)", reduce_vector),
    "distance": Op("ti.math.distance({0}, {1} + 0.7391)", "_norm({0} - {1} - 0.7391)", pair_vectors),
    "cross2": Op("{0}.cross({1})", "_cross2({0}, {1})", cross2),
    "determinant": Op("{0}.determinant()", "_det({0})", reduce_square),
    "determinant_fn": Op("ti.math.determinant({0})", "_det({0})", reduce_square),
    "trace": Op("{0}.trace()", "torch.trace({0})", reduce_square),
    # vectors
    "cross3": Op("{0}.cross({1})", "torch.linalg.cross({0}, {1})", cross3),
    "cross3_fn": Op("ti.math.cross({0}, {1})", "torch.linalg.cross({0}, {1})", cross3),
    "norm_eps": Op("{0}.norm(0.25)", "torch.sqrt(_norm_sqr({0}) + 0.25)", reduce_any),
    "norm_inv": Op("{0}.norm_inv(0.25)", "torch.rsqrt(_norm_sqr({0}) + 0.25)", reduce_any),
    "normalized": Op("({0} + 0.7391).normalized()", "_normalized({0} + 0.7391)", vector_same),
    "normalize_fn": Op("ti.math.normalize({0} + 0.7391)", "_normalized({0} + 0.7391)", vector_same),
    "normalized_eps": Op("({0} + 0.7391).normalized(0.5)", "(({0} + 0.7391) / (_norm({0} + 0.7391) + 0.5))",
                         vector_same),
    "matvec": Op("({0} @ {1})", "({0} @ {1})", matvec),
    "vector": Op("ti.Vector([{args}])", "torch.stack([{args}])", vector_ctor, params=vector_ctor_params),
    "vector_dt": Op("ti.Vector([{args}], dt=ti.f64)", "torch.stack([{args}])", vector_ctor,
                    params=vector_ctor_params),
    "vector_type": Op("vec{n}d({args})", "torch.stack([{args}])", vector_ctor, params=vector_ctor_params),
    "type_fill": Op("{type}({0})", "_filled({shape}, {0})", filled, params=type_params),
    "type_copy": Op("{type}({0})", "(+{0})", typed_copy, params=type_params),
    # matrices
    "matmul": Op("({0} @ {1})", "({0} @ {1})", matmat),
    "transpose": Op("{0}.transpose()", "{0}.T", transpose),
    "outer": Op("{0}.outer_product({1})", "torch.outer({0}, {1})", outer),
    "inverse": Op("(ti.Matrix.identity(ti.f64, {n}) + 0.25 * ti.tanh({0})).inverse()",
                  "torch.linalg.inv(_eye({n}) + 0.25 * torch.tanh({0}))", square_same, params=identity_params),
    "inverse_fn": Op("ti.math.inverse(ti.Matrix.identity(ti.f64, {n}) + 0.25 * ti.tanh({0}))",
                     "torch.linalg.inv(_eye({n}) + 0.25 * torch.tanh({0}))", square_same, params=identity_params),
    "matrix": Op("ti.Matrix([{rows}])", "_matrix({n}, {m}, [{args}])", matrix_ctor, params=matrix_ctor_params),
    "matrix_type": Op("mat{n}{m}d([{rows}])", "_matrix({n}, {m}, [{args}])", matrix_ctor,
                      params=matrix_ctor_params),
}
"""op name -> Op. The grammar draws from these in this order (earlier ones are simpler: shrinking goes there)."""

# Ops whose operands the grammar keeps to leaves: a constructor of n entries would otherwise grow the
# program n-fold per level.
CONSTRUCTORS = frozenset({"vector", "vector_dt", "vector_type", "matrix", "matrix_type"})

NAMESPACE_TYPES = {f"vec{n}d": ("vector", n) for n in VECTOR_SIZES}
NAMESPACE_TYPES.update({f"mat{n}{m}d": ("matrix", (n, m)) for n, m in MATRIX_SHAPES})


def taichi_annotation(shape: tuple) -> str:
    """The annotation spelling of a core shape (float64 types: ti.math.vec3 is float32, docs/limits.md)."""
    if shape == ():
        return "ti.f64"
    if len(shape) == 1:
        return f"ti.types.vector({shape[0]}, ti.f64)"
    return f"ti.types.matrix({shape[0]}, {shape[1]}, ti.f64)"


def shape_text(shape: tuple) -> str:
    return {0: "scalar", 1: "vector", 2: "matrix"}[len(shape)] + ("" if shape == () else str(shape))


def param_values(params: tuple) -> dict[str, Any]:
    return dict(params)
