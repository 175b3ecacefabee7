"""The Function classes are flat (issue 39): each is one way of computing a function (a kind, generated
bodies, calls of other functions) beside one kind of arguments, which it holds (``_derived``) instead of
inheriting. No class inherits from two, and no chain from a class up to ``Function`` is longer than three
classes."""
import importlib
import pkgutil

import taichi as ti

import tidiff as td
from tidiff._derived import SameArguments, TangentArguments
from tidiff._protocol import Function


def function_classes() -> set[type]:
    for module in pkgutil.walk_packages(td.__path__, "tidiff."):
        importlib.import_module(module.name)
    found: set[type] = set()
    todo = [Function]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("tidiff.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def chain(cls: type) -> list[type]:
    """``cls`` and its bases up to and including Function."""
    return [c for c in cls.__mro__ if isinstance(c, type) and issubclass(c, Function)]


def test_no_chain_is_longer_than_three_classes():
    classes = function_classes()
    assert len(classes) >= 15  # kinds, pointwise and composed transforms, compositions, time loops
    long = {c.__name__: [k.__name__ for k in chain(c)] for c in classes if len(chain(c)) > 3}
    assert not long


def test_no_class_inherits_from_two():
    assert not [c.__name__ for c in function_classes() if len(c.__bases__) > 1]


def test_derived_functions_hold_their_arguments():
    @ti.func
    def f(x: ti.math.vec2) -> ti.f64:
        return x.dot(x)

    fn = td.function(f)
    assert fn.arguments is None  # a kind's own
    g = td.grad(f)
    assert isinstance(g.arguments, SameArguments) and g.param_names() == ["x"]
    t = g.tangent()
    assert isinstance(t.arguments, TangentArguments) and t.param_names() == ["x", "dx"]
    assert [s.shape for s in t.declared_specs()] == [(2,), (2,)]
