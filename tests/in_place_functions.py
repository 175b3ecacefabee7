"""The @ti.funcs that tests/test_tensors_in_place.py (CPU) and tests/cuda_in_place.py (CUDA) run on tensors in place."""
import taichi as ti


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
