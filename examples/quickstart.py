"""tidiff in one screen: derivatives of Taichi code, batched, on the host and in a kernel."""
import numpy as np
import taichi as ti

import tidiff as td

ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.WARN)


@ti.func
def p(x):
    return x**3 + 2 * x**2 - 3 * x + 1


@ti.func
def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])


print("dp/dx at 1.0:", td.grad(p)(1.0))  # 4.0

x = np.random.default_rng(0).standard_normal((4, 3))  # a batch of 4 vec3s
print("grad f, one launch over the batch:\n", td.grad(f)(x, 2.0))
print("jacobian by s, per element:", td.jacobian(f, argnums=1)(x, 2.0))
print("hessian of f, shape:", td.hessian(f)(x, 2.0).shape)  # (4, 3, 3)

y, ty = td.jvp(f, (x, 2.0), (np.ones_like(x), 0.0))
print("jvp:", ty)

# Kernels over fields, with declared inputs and outputs
u = ti.field(ti.f64, shape=16)
w = ti.field(ti.f64, shape=())
loss = ti.field(ti.f64, shape=())


@ti.kernel
def energy():
    for i in u:
        loss[None] += w[None] * u[i] ** 2


E = td.function(energy, inputs=[u, w], outputs=[loss])
print("E:", E(np.ones(16), 2.0), " dE/du, dE/dw:", td.grad(E, argnums=(0, 1))(np.ones(16), 2.0))

# Derivatives inside a kernel
dpdx = td.grad(p)


@ti.kernel
def slope_at_one() -> ti.f64:
    return dpdx(1.0)


print("in a kernel:", slope_at_one())
print(td.cache_info())
