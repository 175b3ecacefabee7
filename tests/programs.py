"""Field programs shared by several test files (each kernel compiles once per process)."""
import numpy as np
import taichi as ti
import torch

# the API.md 1b example: a kernel over module-global fields, += accumulation
x = ti.field(ti.f64, shape=16)
w = ti.field(ti.f64, shape=())
loss = ti.field(ti.f64, shape=())


@ti.kernel
def energy():
    for i in x:
        loss[None] += w[None] * x[i] ** 2


# the first kernel of two-kernel programs: state (u, v) -> intermediate field mid
u = ti.field(ti.f64, shape=4)
v = ti.Vector.field(2, ti.f64, shape=4)
mid = ti.Vector.field(2, ti.f64, shape=4)
out = ti.field(ti.f64, shape=4)


@ti.kernel
def stage_one():
    for i in u:
        mid[i] = ti.Vector([ti.sin(u[i]) * v[i][0], u[i] * v[i][1]])


@ti.kernel
def stage_two():
    for i in mid:
        out[i] += mid[i].norm_sqr() + ti.exp(mid[i][0])


def two_stages():
    stage_one()
    stage_two()


def torch_two_stages(u_, v_):
    """``out`` of two_stages in torch."""
    m = torch.stack([torch.sin(u_) * v_[:, 0], u_ * v_[:, 1]], dim=1)
    return (m * m).sum(1) + torch.exp(m[:, 0])


# a multi-step simulation: double buffers through a template kernel, a Python helper
M = 5
s0, s1, s2, s3 = (ti.field(ti.f64, shape=M) for _ in range(4))
coef = ti.field(ti.f64, shape=M)
energy_out = ti.field(ti.f64, shape=())
COEF = np.linspace(0.5, 1.5, M)
coef.from_numpy(COEF)


@ti.kernel
def advance(h: ti.f64, src: ti.template(), dst: ti.template()):
    for i in src:
        dst[i] = src[i] + h * coef[i] * ti.sin(src[(i + 1) % M])


@ti.kernel
def reduce_energy():
    for i in s3:
        energy_out[None] += s3[i] ** 2


def two_steps(src, mid, dst):
    advance(0.1, src, mid)
    advance(0.2, mid, dst)


def simulate():
    s2.fill(0)
    two_steps(s0, s1, s2)
    advance(0.3, s2, s3)
    reduce_energy()


def torch_simulate(s):
    c = torch.tensor(COEF)
    for h in (0.1, 0.2, 0.3):
        s = s + h * c * torch.sin(torch.roll(s, -1))
    return s, (s**2).sum()


class Program:
    """A field program through the public API, with the calls the field tests make.

    ``primal(args)``, ``vjp(args, cotangents)`` and ``jvp(args, tangents)``
    return flat lists, whatever the number of outputs.
    """

    def __init__(self, program, inputs, outputs, name=None):
        import tidiff as td

        self.td = td
        self.fn = td.function(program, inputs=inputs, outputs=outputs, name=name)
        self.in_specs = self.fn.declared_specs()
        self.out_specs, _ = self.fn.signature(self.in_specs)

    def _flat(self, value):
        return list(value) if len(self.out_specs) > 1 else [value]

    def primal(self, args):
        return self._flat(self.fn(*args))

    def vjp(self, args, cotangents):
        outs, vjp_fn = self.td.vjp(self.fn, *args)
        cts = [np.zeros(s.shape, s.dtype) if c is None else c for c, s in zip(cotangents, self.out_specs)]
        return self._flat(outs), list(vjp_fn(tuple(cts) if len(cts) > 1 else cts[0]))

    def jvp(self, args, tangents):
        outs, touts = self.td.jvp(self.fn, tuple(args), tuple(tangents))
        return self._flat(outs), self._flat(touts)

    def compiles(self):
        return self.fn._counter.compiles()
