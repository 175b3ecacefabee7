"""Forward mode for ndarray kernels: the tangent transform of a whole ``@ti.kernel``.

Taichi's ``ti.ad.FwdMode`` does not take ndarrays, so tidiff transforms the
kernel's source as it transforms a ``@ti.func`` (``_tangent``): every input
ndarray ``x`` gets a tangent parameter ``dx``, every output ``y`` a ``dy``
that the tangent kernel writes beside ``y``. The result is an ordinary
kernel: Taichi's reverse mode over it gives Hessian-vector products (second
order, see ``_kinds/ndarray.py``).

# NOTE: [Kernel loops] In a kernel every ``for`` runs over indices (``range``,
# ``ti.ndrange``, or a struct-for over an ndarray's index space), never over
# differentiable values, so loops are copied as they are.
"""
import ast
from collections.abc import Sequence
from typing import Any

import taichi as ti

from ._codegen import compile_source
from ._errors import TransformError
from ._tangent import jvp_func, rule_helpers
from ._tangent.parse import Parsed, parse
from ._tangent.sym import RULE_HELPERS, TAICHI, spell_taichi
from ._tangent.transform import Transformer, _name


class KernelTransformer(Transformer):
    """The tangent kernel: tangents of the inputs and outputs become parameters."""

    def __init__(self, parsed: Parsed, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        params = [a.arg for a in parsed.tree.args.args]
        super().__init__(parsed, [p in inputs for p in params], jvp_func)
        self.inputs, self.outputs = list(inputs), list(outputs)

    def _check_fields(self) -> None:
        """Global fields may be read as constants; writing one from differentiable values is refused."""
        params = set(self.params)
        for name in sorted(self.active - self.locals):
            raise TransformError(
                f"a write to the global `{name}` from differentiable values", self.parsed.filename,
                self.parsed.lineno(self.tree),
                "make it an ndarray parameter and list it in outputs=",
            )
        for name in sorted((self.active & params) - set(self.inputs) - set(self.outputs)):
            raise TransformError(
                f"a write to parameter `{name}` from differentiable values", self.parsed.filename,
                self.parsed.lineno(self.tree), f"list {name!r} in outputs= (or inputs=)",
            )

    def stmt_For(self, node: ast.For) -> None:  # NOTE: [Kernel loops]
        self.emit(
            ast.For(node.target, node.iter, self.nested(node.body), self.nested(node.orelse) if node.orelse else [])
        )

    def run(self) -> ast.FunctionDef:
        args = self.tree.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or args.defaults:
            raise self.error(self.tree, "a kernel parameter list with defaults, *args or keyword-only parameters",
                             "give the kernel plain positional parameters")
        self._check_fields()
        by_name = {a.arg: a for a in args.args}
        extra = [ast.arg(self.namer.tangent(p), by_name[p].annotation) for p in self.inputs + self.outputs]
        name = self.namer.fresh(self.tree.name + "_jvp")
        body = self.tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        for stmt in body:
            self.statement(stmt)
        decorator = ast.Attribute(_name(TAICHI), "kernel", ast.Load())
        fn = ast.FunctionDef(name, ast.arguments([], args.args + extra, None, [], [], None, []),
                             self.block or [ast.Pass()], [decorator], None)
        return ast.fix_missing_locations(spell_taichi(fn, self.taichi_name))

    def stmt_Return(self, node: ast.Return) -> None:
        raise self.error(node, "a kernel that returns a value", "write results into an output ndarray")


def tangent_kernel(kernel: Any, inputs: Sequence[str], outputs: Sequence[str]) -> tuple[Any, list[str], list[str]]:
    """The forward-mode kernel of an ndarray kernel.

    Returns ``(kernel_jvp, input_tangents, output_tangents)``: ``kernel_jvp``
    takes the kernel's parameters, then a tangent (named as listed,
    ``d<input>`` unless taken) for each of ``inputs`` and for each output
    (zeroed by the caller), and writes outputs and their tangents. Parameters
    not in ``inputs`` (integer arrays, numbers) carry no tangent.
    """
    parsed = parse(kernel)
    transformer = KernelTransformer(parsed, inputs, outputs)
    tree = transformer.run()
    text = ast.unparse(ast.Module([tree], [])) + "\n"
    namespace = dict(parsed.namespace)
    namespace.update(transformer.helpers)
    namespace["ti"] = ti
    namespace[transformer.taichi_name] = ti
    namespace[RULE_HELPERS] = rule_helpers
    names = transformer.namer.tangents
    return (compile_source(text, tree.name, namespace, tag="kernel-jvp"),
            [names[p] for p in inputs], [names[p] for p in outputs])
