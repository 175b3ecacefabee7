"""Kernels and Python programs over global fields as Functions (API.md 1b).

The engine itself is ``_fields.FieldProgram`` (twins, replayed adjoints,
forward mode); this adapter gives it the Function interface. Field programs
have fixed shapes: they take no batch dims.

NOTE: [Second order of a field program] A field program has no ``@ti.func``
body, so its transforms cannot be transformed as source; they ask it
instead (``second_order_jvp``/``second_order_vjp``). Every answer is made
of reverse passes of the *tangent program* ``T: (x, dx) -> (y, dy)``
(NOTE: [Tangent program] in ``_fields/tangent.py``), one pass giving, for
cotangents ``c`` on ``y`` and ``e`` on ``dy``,

    gx = J^T c + sum_k e_k H_k dx        gdx = J^T e        and  dy = J dx,

exactly. With ``H_k`` the (symmetric) Hessian of output component ``k``:

- the jvp of a Jacobian (``grad``, ``jacrev``, ``jacfwd``...) in direction
  ``t`` is, per output component ``q``, row ``q`` of ``dJ = (H_q t)^T``: one
  pass with ``dx = t``, ``e = e_q`` (``gdx`` gives row ``q`` of ``J``
  itself). ``hvp`` is one pass; ``hessian`` one per input component.
- the vjp of a Jacobian with cotangent ``C`` (rows ``C_q``) is
  ``sum_q H_q C_q`` (H symmetric): one pass per ``q`` with ``dx = C_q``,
  ``e = e_q``, plus ``J^T c`` for cotangents ``c`` on plain outputs.
- the vjp function ``V(x, c) = J^T c``: its jvp in ``(t, s)`` is one pass
  with ``dx = t``, ``e = c``, ``c_y = s`` (``gx = J^T s + sum_k c_k H_k t``);
  its vjp with cotangent ``r`` is one pass with ``dx = r``, ``e = c``:
  ``gx = sum_k c_k H_k r`` for ``x`` and ``dy = J r`` for ``c``.

Third order (a transform of these) is not available for field programs.
"""
import numpy as np

from ._arrays import contiguous
from ._function import Function
from ._signature import ArgSpec
from ._tree import flat_tree


class FieldFunction(Function):
    """A kernel or Python program over global fields, with declared inputs and outputs."""

    def __init__(self, program, inputs, outputs, name=None):
        from ._fields import FieldProgram

        super().__init__(name or getattr(program, "__name__", "program"))
        self.program = FieldProgram(program, inputs=inputs, outputs=outputs)
        self._counter.add_program(self.program)
        self._in = [ArgSpec(*s) for s in self.program.in_specs]
        self._out = [ArgSpec(*s) for s in self.program.out_specs]

    def declared_specs(self):
        return self._in

    def signature(self, in_specs):
        return self._out, flat_tree(len(self._out), len(self._out) == 1)

    def read(self, args, call=None):
        batch = super().read(args, call)
        if batch.batch_shape != ():
            raise ValueError(
                f"{call or self.name}: a field program takes arrays of exactly its fields' shapes "
                f"{[s.shape for s in self._in]}, with no batch dims; got batch dims {batch.batch_shape}"
            )
        batch.arrays = [contiguous(np.broadcast_to(a, s.shape)) for a, s in zip(batch.arrays, self._in)]
        return batch

    def _evaluate(self, batch, counter):
        counter.add_program(self.program)
        return list(self.program.primal(batch.arrays))

    def _vjp(self, batch, cotangents, counter):
        counter.add_program(self.program)
        cts = [np.zeros(s.shape, s.dtype) if c is None else np.broadcast_to(c, s.shape) for c, s in zip(cotangents, self._out)]
        outs, grads = self.program.vjp(batch.arrays, [contiguous(c) for c in cts])
        return list(outs), list(grads)

    def _jvp(self, batch, tangents, counter):
        counter.add_program(self.program)
        ts = [np.zeros(s.shape, s.dtype) if t is None else np.broadcast_to(t, s.shape) for t, s in zip(tangents, self._in)]
        outs, touts = self.program.jvp(batch.arrays, [contiguous(t) for t in ts])
        return list(outs), list(touts)

    # -- second order (NOTE: [Second order of a field program]) -----------
    def second_order_jvp(self, derived, batch, tangents, counter):
        kind = self._derived(derived)
        if kind is None:
            return super().second_order_jvp(derived, batch, tangents, counter)
        arrays, tangents = self._second_order_args(derived, batch, tangents, counter)
        n = len(self._in)
        if kind == "vjp_fn":
            x, c = arrays[:n], arrays[n:]
            t, s = tangents[:n], tangents[n:]
            _, _, gx, gdx = self._tangent_vjp(x, t, s, c)
            floats = self._floats()
            return [gdx[k] for k in floats], [gx[k] for k in floats]
        return self._jacobian_jvp(derived, arrays, tangents)

    def second_order_vjp(self, derived, batch, cotangents, counter):
        kind = self._derived(derived)
        if kind is None:
            return super().second_order_vjp(derived, batch, cotangents, counter)
        arrays, _ = self._second_order_args(derived, batch, None, counter)
        n = len(self._in)
        if kind == "vjp_fn":
            x, c = arrays[:n], arrays[n:]
            floats = self._floats()
            r = [None] * n
            for k, ct in zip(floats, cotangents):
                r[k] = ct
            _, dy, gx, gdx = self._tangent_vjp(x, r, None, c)
            grads = list(gx) + [dy[o] if s.is_float else None for o, s in enumerate(self._out)]
            return [gdx[k] for k in floats], grads
        return self._jacobian_vjp(derived, arrays, cotangents)

    def _derived(self, derived):
        """``"jacobian"`` for grad/jacrev/jacfwd/... of this program, ``"vjp_fn"`` for its vjp function."""
        from ._transforms import Transformed
        from ._vjp_function import VjpFunction

        if getattr(derived, "parent", None) is not self:
            return None
        if isinstance(derived, VjpFunction):
            return "vjp_fn"
        if isinstance(derived, Transformed) and derived.kind in (
            "grad", "value_and_grad", "jacrev", "jacfwd", "jacobian"
        ):
            return "jacobian"
        return None

    def _second_order_args(self, derived, batch, tangents, counter):
        """Arrays of exactly the specs' shapes; the tangent program, counted for ``derived``."""
        if batch.batch_shape != ():
            raise ValueError(
                f"{derived.name}: a field program takes arrays of exactly its fields' shapes, "
                f"with no batch dims; got batch dims {batch.batch_shape}"
            )
        counter.add_program(self.program)
        counter.add_program(self.program.tangent())
        specs = batch.specs
        arrays = [contiguous(np.broadcast_to(a, s.shape)) for a, s in zip(batch.arrays, specs)]
        if tangents is not None:
            tangents = [
                None if t is None or not s.is_float else contiguous(np.broadcast_to(t, s.shape))
                for t, s in zip(tangents, specs)
            ]
        return arrays, tangents

    def _floats(self):
        return [k for k, s in enumerate(self._in) if s.is_float]

    def _tangent_vjp(self, x, dx, c_y, c_dy):
        """One reverse pass of the tangent program: ``(y, dy, gx, gdx)``, each a list per field.

        ``dx`` per input, ``c_y`` and ``c_dy`` per output (or None for all
        zero); entries are None for zero (and for integer fields).
        """
        n, m = len(self._in), len(self._out)
        c_y = c_y or [None] * m
        c_dy = c_dy or [None] * m
        floats_in, floats_out = self._floats(), [o for o, s in enumerate(self._out) if s.is_float]
        args = list(x) + [
            np.zeros(self._in[k].shape, self._in[k].dtype) if dx[k] is None else dx[k] for k in floats_in
        ]
        cts = [None if c is None else contiguous(np.broadcast_to(c, s.shape)) for c, s in zip(c_y, self._out)]
        cts += [None if c_dy[o] is None else contiguous(np.broadcast_to(c_dy[o], self._out[o].shape)) for o in floats_out]
        outs, grads = self.program.tangent().vjp(args, cts)
        dy, gdx = [None] * m, [None] * n
        for j, o in enumerate(floats_out):
            dy[o] = outs[m + j]
        for j, k in enumerate(floats_in):
            gdx[k] = grads[n + j]
        return outs[:m], dy, grads[:n], gdx

    def _basis(self, o, q):
        spec = self._out[o]
        e = np.zeros(spec.size, spec.dtype)
        e[q] = 1.0
        return e.reshape(spec.shape)

    def _jacobian_jvp(self, derived, x, t):
        """jvp of a Jacobian-valued transform: one pass per component of each differentiated output."""
        argnums, items, flat_specs, _ = derived.layout(self._in)
        m = len(self._out)
        blocks, dblocks = {}, {}
        y = dy = None
        for o in sorted({it[1] for it in items if it[0] == "jac"}):
            rows = {a: [] for a in argnums}
            drows = {a: [] for a in argnums}
            for q in range(self._out[o].size if self._out[o].is_float else 0):
                c_dy = [None] * m
                c_dy[o] = self._basis(o, q)
                y, dy, gx, gdx = self._tangent_vjp(x, t, None, c_dy)
                for a in argnums:
                    rows[a].append(gdx[a])
                    drows[a].append(gx[a])
            for a in argnums:
                blocks[o, a] = self._stack(rows[a], o, a)
                dblocks[o, a] = self._stack(drows[a], o, a)
        if y is None:
            y, dy, _, _ = self._tangent_vjp(x, t, None, None)
        outs, touts = [], []
        for it, spec in zip(items, flat_specs):
            if it[0] == "jac":
                outs.append(blocks[it[1], it[2]])
                touts.append(dblocks[it[1], it[2]])
            else:
                outs.append(y[it[1]])
                touts.append(np.zeros(spec.shape, spec.dtype) if dy[it[1]] is None else dy[it[1]])
        return outs, touts

    def _jacobian_vjp(self, derived, x, cotangents):
        """vjp of a Jacobian-valued transform: one pass per component of each differentiated output."""
        argnums, items, _, _ = derived.layout(self._in)
        n, m = len(self._in), len(self._out)
        c_y = [None] * m
        c_jac = {}
        for it, ct in zip(items, cotangents):
            if ct is None:
                continue
            if it[0] == "out":
                if self._out[it[1]].is_float:
                    c_y[it[1]] = ct if c_y[it[1]] is None else c_y[it[1]] + ct
            else:
                key = (it[1], it[2])
                c_jac[key] = ct if key not in c_jac else c_jac[key] + ct
        grads = [np.zeros(s.shape, s.dtype) if s.is_float else None for s in self._in]
        pending_c_y = c_y if any(c is not None for c in c_y) else None
        blocks = {}
        y = None

        def accumulate(gx):
            for k in self._floats():
                grads[k] = grads[k] + gx[k]

        for o in sorted({it[1] for it in items if it[0] == "jac"}):
            rows = {a: [] for a in argnums}
            size = self._out[o].size if self._out[o].is_float else 0
            for q in range(size):
                direction = [None] * n
                for a in argnums:
                    ct = c_jac.get((o, a))
                    if ct is not None:
                        row = np.reshape(ct, (size,) + self._in[a].shape)[q]
                        direction[a] = row if direction[a] is None else direction[a] + row
                c_dy = [None] * m
                c_dy[o] = self._basis(o, q)
                y, _, gx, gdx = self._tangent_vjp(x, direction, pending_c_y, c_dy)
                pending_c_y = None  # J^T c enters once
                accumulate(gx)
                for a in argnums:
                    rows[a].append(gdx[a])
            for a in argnums:
                blocks[o, a] = self._stack(rows[a], o, a)
        if y is None or pending_c_y is not None:
            y, _, gx, _ = self._tangent_vjp(x, [None] * n, pending_c_y, None)
            accumulate(gx)
        outs = [blocks[it[1], it[2]] if it[0] == "jac" else y[it[1]] for it in items]
        return outs, grads

    def _stack(self, rows, o, a):
        """Rows of a Jacobian block (one per output component) as ``out.shape + arg.shape``."""
        shape = self._out[o].shape + self._in[a].shape
        if not rows:
            return np.zeros(shape, self._out[o].dtype)
        return np.stack(rows).reshape(shape)
