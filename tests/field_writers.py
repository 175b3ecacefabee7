"""@ti.funcs of another module, writing a field of that module (tests/test_inlined_funcs.py inlines them)."""
import taichi as ti

SCALE = 3.0
bucket = ti.field(ti.f64, shape=4, needs_grad=True)


@ti.func
def deposit(i, v):
    s = SCALE * v  # a local named as the caller's, a global the caller's module does not have
    bucket[i % 4] += s * s
