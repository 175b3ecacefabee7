"""The engine of programs over fields: a kernel, or a Python function launching kernels, over global fields.

:class:`FieldProgram` turns ``program`` plus the fields it reads
(``inputs``) and writes (``outputs``) into a function of NumPy arrays with
``primal``, ``vjp`` and ``jvp``:

- The program runs on tidiff-owned *twins* of every field it reaches
  (:mod:`.twins`); its kernels, the ``@ti.func``s they call and the Python
  functions between them are rebuilt over the twins (:mod:`.rebind`), found
  by following names (:mod:`.graph`). The user's fields are never written
  and need no ``needs_grad``/``needs_dual``.
- Each evaluation loads the inputs, copies the current values of every
  other reachable field (constants and intermediate state), zeroes the
  outputs (so ``+=`` accumulates from zero) and clears gradients or duals:
  nothing of one call is visible in the next.
- Reverse mode records the launches and replays their adjoints backwards
  (:mod:`.tape`). Forward mode is the tangent program (:mod:`.tangent`):
  every kernel replaced by its tangent kernel (``_tangent/kernels.py``);
  ``ti.ad.FwdMode`` is not used.
- Each kernel compiles once per variant (primal, adjoint, tangent); later
  calls with new values compile nothing.

Limitations:
    - Fields and kernels are followed through global and closure *names*
      only: ``self.x``, ``sim.step``, lists of fields and
      ``@ti.data_oriented`` classes are not (a launch of a kernel tidiff did
      not rebuild is refused with a ``TypeError`` before it runs; a field
      reached through an attribute is the user's own, untracked, and a
      ``fill``/``from_numpy`` on it inside the program writes it).
    - ``program`` takes no parameters; kernels it launches may take any
      (fields passed by name are swapped for twins).
    - Fields are dense scalar/vector/matrix fields; twins are dense, so a
      sparse (pointer/bitmasked) layout's activation is not reproduced.
      Struct fields and quantized types are not supported.
    - Python-scope element writes inside a Python program (``x[None] = 0``)
      are not recorded for reverse mode and carry no tangent in forward
      mode, as with ``ti.ad.Tape``; use ``x.fill(0)`` or a kernel. Forward
      mode has the tangent program's limits (:mod:`.tangent`).
    - ``ti.ad.grad_replaced``/``grad_for`` functions are honoured as ``ti.ad.Tape``
      does (their backward is the gradient; ``no_grad`` stops it); forward mode
      of a program calling one is refused, naming it.
    - An integer input is not differentiable: its ``vjp`` gradient is
      ``None`` and its tangent is ignored. An integer output's tangent is
      zeros and its cotangent is ignored.
    - Taichi's global data access rules apply as usual; breaking them
      gives wrong gradients silently (taichi #3885).
    - Each call moves data field by field (load, zero, read: about 10-25
      small launches, 1-5 ms on CPU for a handful of fields); one fused
      kernel per program would cut that.
"""
from .program import FieldProgram, FieldSpec

__all__ = ["FieldSpec", "FieldProgram"]
