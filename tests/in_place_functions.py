"""The @ti.funcs that tests/test_tensors_in_place.py (CPU) and tests/cuda_in_place.py (CUDA) run on tensors in place."""
import taichi as ti

import tidiff as td


@ti.func
def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])


@ti.func
def g(x: ti.math.vec3) -> ti.math.vec2:
    return ti.Vector([x[0] * x[1], ti.exp(x[2])])


@ti.func
def energy(F: ti.math.mat3) -> ti.f64:
    """Neo-Hookean: its Hessian's pushes run in a loop, so its blocks are written into the outputs by a kernel."""
    J = F.determinant()
    return 0.5 * ((F.transpose() @ F).trace() - 3.0) - ti.log(J) + 0.25 * ti.log(J) ** 2


def pendulum_energy(n: int, length: int) -> td.Function:
    """``(x0, v0, k) -> energy after length steps`` of n pendulums: a time loop of a field program's step,
    composed with a field program."""
    x, v = ti.field(ti.f64, n), ti.field(ti.f64, n)
    x_next, v_next = ti.field(ti.f64, n), ti.field(ti.f64, n)
    k = ti.field(ti.f64, ())
    total = ti.field(ti.f64, ())

    @ti.kernel
    def advance():
        for i in x:
            v_next[i] = v[i] - 0.01 * k[None] * ti.sin(x[i])
            x_next[i] = x[i] + 0.01 * v_next[i]

    @ti.kernel
    def energy_of_state():
        for i in x:
            total[None] += 0.5 * v[i] ** 2 + 2.0 * (1 - ti.cos(x[i]))

    step = td.function(advance, inputs=[x, v, k], outputs=[x_next, v_next])
    return td.compose(td.function(energy_of_state, inputs=[x, v], outputs=[total]), td.scan(step, length=length))
