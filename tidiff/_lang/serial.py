"""A generated kernel's serial form, and launches that keep the faster of a kernel's two forms on the CPU.

NOTE: [Small loops run serially] On the CPU Taichi runs every parallel loop of a kernel on its thread pool:
the launching thread wakes the workers and waits for them all, a cost of its own whatever the loop does. On
this project's 2-core CPU (2026-11-30) a kernel whose parallel loop runs one iteration took 50 us a launch,
the same loop under ``ti.loop_config(serialize=True)`` 9 us. A serial loop also adds into gradients without
atomics (Taichi demotes them where no other thread runs), and a float64 atomic add is a compare-and-swap loop
(NOTE: [Owned gradient entries]). A replay launches one adjoint per kernel launch of the program, and in
DiffTaichi-style programs most of them loop over a few hundred or thousand entries: the heat diffusion of
``bench/tape_parity.py`` (32x32, 100 steps) took 16.2 ms a gradient with parallel adjoints, 9.1 ms with
serial ones (the tape 16.6 ms); at 256x256, 29.6 and 12.9 ms (the tape 41 ms). With more cores and more
work per launch the parallel form wins. So a kernel tidiff writes for replays has both forms, and its
launches (:class:`FasterForm`) choose by what they measure:

- the serial form first (a launch that compiles is not timed);
- where its fastest of a few launches took less than a parallel loop of one iteration does (the dispatch
  alone, measured once per Taichi program: :func:`dispatch_time`), serial for good: the parallel form
  cannot be faster;
- else the parallel form is compiled and timed on the next launches, and the form with the faster fastest
  launch is kept;
- where Taichi does not compile the serial form (at its first launch), the parallel one, for good.

Only kernels taking numbers alone (a step's ``t``, as DiffTaichi's do) choose: their launches and the probe's
skip Taichi's own call, which for a kernel taking fields costs about as much as the dispatch itself. Others
run their parallel form. Every launch is one real launch of one form, and both forms compute the same values
(the serial one runs in one of the orders the parallel one may), up to the order of atomic sums. Off the CPU
the parallel form runs from the start.
"""
from __future__ import annotations

import ast
import copy
import time
from collections.abc import Callable
from typing import Any

import taichi as ti
from taichi._lib.core.taichi_python import SNodeType
from taichi.lang import impl
from taichi.lang.field import Field

from .compile import kernel_like
from .launch import NumberLaunch, kinds_of
from .naming import Namer, names_in, taichi_name
from .parse import parse, resolve

SAMPLES = 3  # launches timed per form, after the one that compiles it

_dispatch: dict[int, float] = {}  # id of a Taichi program -> its dispatch_time()


def serial_form(tree: ast.FunctionDef, taichi: str, namespace: dict[str, Any]) -> ast.FunctionDef | None:
    """``tree`` (a kernel) with ``ti.loop_config(serialize=True)`` before each of its top-level loops that has
    no ``ti.loop_config`` of its own, a loop over a dense field's cells (a struct-for, which Taichi runs in
    parallel however configured) written over its indices; None where no loop is left to change. ``taichi``
    names the Taichi module in the code, ``namespace`` what its names stand for."""
    body: list[ast.stmt] = []
    changed = False
    for stmt in tree.body:
        if isinstance(stmt, ast.For) and not (body and configures(body[-1], namespace)):
            loop = copy.deepcopy(stmt)
            over = _over_indices(loop.iter, taichi, namespace)
            if over is None and _field_of(loop.iter, namespace) is not None or _is_static(loop.iter, namespace):
                body.append(loop)  # (a struct-for over sparse cells stays one; a static loop is unrolled)
                continue
            loop.iter = loop.iter if over is None else over
            body.append(ast.Expr(ast.Call(ast.Attribute(ast.Name(taichi, ast.Load()), "loop_config", ast.Load()), [],
                                          [ast.keyword("serialize", ast.Constant(True))])))
            body.append(loop)
            changed = True
        else:
            body.append(copy.deepcopy(stmt))
    if not changed:
        return None
    form = copy.deepcopy(tree)
    form.name, form.body = f"{tree.name}_serial", body
    return form


def serial_twin(kernel: Any) -> Any | None:
    """The serial form of ``kernel`` (a program's copy of a user's ``@ti.kernel``) compiled beside it, over the
    same names; None where it has none, or tidiff cannot read it (it then runs as Taichi runs it)."""
    try:
        parsed = parse(kernel)
    except Exception:  # noqa: BLE001 -- (as loop_parts: such a kernel runs whole, in its own form)
        return None
    namer = Namer(names_in(parsed.tree) | set(parsed.namespace))
    namespace = dict(parsed.namespace)
    taichi = taichi_name(namer, namespace)
    namespace[taichi] = ti
    form = serial_form(parsed.tree, taichi, namespace)
    return None if form is None else kernel_like(form, form.name, form.body, namespace, taichi, "serial")


def _over_indices(over: ast.expr, taichi: str, namespace: dict[str, Any]) -> ast.expr | None:
    """``ti.ndrange`` of a dense field's indices for the loop header ``over`` that names it (``x``, or
    ``ti.grouped(x)``: ``ti.grouped(ti.ndrange(...))``), else None."""
    grouped = isinstance(over, ast.Call) and len(over.args) == 1 and not over.keywords \
        and resolve(over.func, namespace) is ti.grouped
    field = _field_of(over.args[0] if grouped else over, namespace)  # type: ignore[attr-defined]
    extent = None if field is None else _dense_extent(field)
    if extent is None:
        return None
    axes: list[ast.expr] = [ast.Tuple([ast.Constant(a), ast.Constant(b)], ast.Load()) for a, b in extent]
    indices = ast.Call(ast.Attribute(ast.Name(taichi, ast.Load()), "ndrange", ast.Load()), axes, [])
    if not grouped:
        return indices
    return ast.Call(ast.Attribute(ast.Name(taichi, ast.Load()), "grouped", ast.Load()), [indices], [])


def _is_static(over: ast.expr, namespace: dict[str, Any]) -> bool:
    return isinstance(over, ast.Call) and resolve(over.func, namespace) is ti.static


def _field_of(node: ast.expr, namespace: dict[str, Any]) -> Field | None:
    value = resolve(node, namespace) if isinstance(node, (ast.Name, ast.Attribute)) else None
    return value if isinstance(value, Field) else None


def _dense_extent(field: Field) -> list[tuple[int, int]] | None:
    """``(first, end)`` of each index of a field whose cells all exist (dense nodes up to the root), else
    None."""
    node = field.snode
    while node is not None and node.ptr.type != SNodeType.root:
        if node.ptr.type not in (SNodeType.place, SNodeType.dense):
            return None
        node = node.parent()
    offset = list(field.snode.ptr.offset) or [0] * len(field.shape)
    return [(o, o + n) for o, n in zip(offset, field.shape, strict=True)]


def serializes(stmt: ast.stmt, namespace: dict[str, Any]) -> bool:
    """Whether the statement is ``ti.loop_config(serialize=True)``."""
    call = _loop_config(stmt, namespace)
    return call is not None and any(k.arg == "serialize" and isinstance(k.value, ast.Constant) and k.value.value is True
                                    for k in call.keywords)


def configures(stmt: ast.stmt, namespace: dict[str, Any]) -> bool:
    """Whether the statement is ``ti.loop_config(...)``."""
    return _loop_config(stmt, namespace) is not None


def _loop_config(stmt: ast.stmt, namespace: dict[str, Any]) -> ast.Call | None:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
            and resolve(stmt.value.func, namespace) is ti.loop_config:
        return stmt.value
    return None


def launches(parallel: Any, serial: Any | None) -> Callable[..., Any]:
    """How a replay launches a kernel of which tidiff wrote ``parallel`` and ``serial`` forms (``serial`` None
    where it has none): by the faster one where the kernel takes numbers only, so that every launch and the
    dispatch probe go through the same direct launch (:class:`~.launch.NumberLaunch`); else, as a kernel
    taking fields or arrays is launched through Taichi's own call, its parallel form."""
    if serial is None or not numbers_only(parallel):
        return NumberLaunch(parallel)
    return FasterForm(parallel, serial)


def numbers_only(kernel: Any) -> bool:
    """Whether a ``@ti.kernel`` (or its Kernel) takes numbers alone, so that a launch past Taichi's call
    (:class:`~.launch.NumberLaunch`) sets every argument."""
    kinds = kinds_of(getattr(kernel, "_primal", kernel))
    return kinds is not None and all(k in ("float", "int") for k in kinds)


class FasterForm:
    """Launches of a kernel that keep the faster of its parallel and serial forms (NOTE: [Small loops run
    serially]); both are ``@ti.kernel`` s of the same parameters, numbers only."""

    def __init__(self, parallel: Any, serial: Any, told: bool = False) -> None:
        self.forms = (NumberLaunch(serial, told), NumberLaunch(parallel, told))  # told: the caller tells a tape
        self.times: tuple[list[float], list[float]] = ([], [])  # per form, each launch's seconds
        self.chosen: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> None:
        if self.chosen is not None:
            self.chosen(*args)
            return
        if impl.current_cfg().arch not in (ti.x64, ti.arm64):
            self.chosen = self.forms[1]
            self.chosen(*args)
            return
        k = 0 if len(self.times[0]) < SAMPLES else 1
        form = self.forms[k]
        compiled = len(form.kernel.compiled_kernels)
        start = time.perf_counter()
        try:
            form(*args)
        except Exception:
            if k == 1 or form.looked:
                raise
            self.chosen = self.forms[1]  # a serial form Taichi does not compile: the kernel's own form, as before
            self.chosen(*args)
            return
        elapsed = time.perf_counter() - start
        if len(form.kernel.compiled_kernels) == compiled:  # (a launch that compiled is not timed)
            self.times[k].append(elapsed)
        kept = choice(self.times, dispatch_time)
        if kept is not None:
            self.chosen = self.forms[kept]

    def compiled(self) -> int:
        """How many compiled instances the two forms have."""
        return sum(len(form.kernel.compiled_kernels) for form in self.forms)


def choice(times: tuple[list[float], list[float]], dispatch: Callable[[], float]) -> int | None:
    """Which form to keep (0 serial, 1 parallel) from the seconds of each form's launches so far (those that
    did not compile); None while more are to be timed. ``dispatch``: what a parallel loop of one iteration
    takes (asked only where it decides)."""
    serial, parallel = times
    if len(serial) < SAMPLES:
        return None
    if not parallel:
        return 0 if min(serial) < dispatch() else None
    if len(parallel) < SAMPLES:
        return None
    return 0 if min(serial) <= min(parallel) else 1


def dispatch_time() -> float:
    """Seconds a launch of a parallel loop of one iteration takes on the CPU, launched as replays launch
    (the fastest of a few, once per Taichi program)."""
    program = id(impl.get_runtime().prog)
    if program not in _dispatch:
        cell = ti.ndarray(ti.i32, 1)

        def one_iteration(a):  # type: ignore[no-untyped-def]
            for i in range(1):
                a[i] = 1

        # (set here: this module's annotations are strings, which Taichi does not read)
        one_iteration.__annotations__ = {"a": ti.types.ndarray(dtype=ti.i32, ndim=1)}
        launch = NumberLaunch(ti.kernel(one_iteration), told=True)  # (no tape records it)
        launch(cell)  # compiles it
        times = []
        for _ in range(5):
            start = time.perf_counter()
            launch(cell)
            times.append(time.perf_counter() - start)
        _dispatch[program] = min(times)
    return _dispatch[program]
