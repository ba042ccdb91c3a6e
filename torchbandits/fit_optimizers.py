"""The optimisers of :func:`~torchbandits.fitting.fit_kernel`, on the closed-form gradient.

Each maximises a :class:`~torchbandits.gp_likelihood.FitObjective` over the parameters
``params[i]``, ``i ∈ trainable`` (unconstrained, see :class:`~torchbandits.gp_likelihood.Box`),
counts its evaluations in ``evals[0]`` and returns the new parameter list (the input is not
modified; the first and the last also the objective there):

* :func:`scipy_lbfgs` — SciPy's L-BFGS-B, as BoTorch's ``fit_gpytorch_mll``;
* :func:`torch_optimise` — ``torch.optim.LBFGS`` (strong-Wolfe line search) or Adam;
* :func:`warm_bfgs` — dense BFGS (Nocedal & Wright 2006, Algorithm 6.1, backtracking Armijo line
  search) whose inverse-Hessian approximation is returned and handed to the next fit: after one
  new observation the optimum and the curvature barely move, so the first quasi-Newton step from
  the previous optimum is nearly a Newton step and a refit takes a few evaluations instead of the
  ~10 that L-BFGS-B needs to rebuild its curvature from scratch. Same stopping rule as the
  L-BFGS-B call (``gtol`` on the largest gradient entry, ``ftol`` on the relative decrease).
  Safeguards: a step moves no coordinate by more than ``MAX_STEP``, and when the carried
  curvature gives no acceptable step (e.g. after a lengthscale sat at its bound, where the
  sigmoid is flat and the inverse Hessian huge) it is dropped and the search restarts from
  steepest descent — as L-BFGS-B starts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .gp_likelihood import FitObjective

__all__ = ["scipy_lbfgs", "torch_optimise", "warm_bfgs"]

GTOL, FTOL = 1e-5, 1e-10
MAX_STEP = 4.0  # largest move of one unconstrained coordinate per BFGS step (a box spans ~±7)


def scipy_lbfgs(params: list[Tensor], trainable: list[int], objective: FitObjective,
                max_iter: int, evals: list[int],
                first: tuple[Tensor, list[Tensor]] | None = None) -> tuple[list[Tensor], float]:
    """Maximise ``objective`` over ``params[i]``, ``i ∈ trainable``, with SciPy's L-BFGS-B;
    returns the new parameter list. ``first``: ``objective(params)`` (value, gradient list)
    already evaluated by the caller — served to SciPy's first call (at ``params``) instead of
    evaluating it again."""
    from scipy.optimize import minimize

    params = [p.clone() for p in params]
    shapes = [params[i].shape for i in trainable]
    sizes = [params[i].numel() for i in trainable]
    x0 = torch.cat([params[i].reshape(-1) for i in trainable]).cpu().numpy()
    cached = [first]

    def set_flat(flat) -> None:  # type: ignore[no-untyped-def]
        vec = torch.as_tensor(flat, dtype=params[0].dtype).to(params[0].device)
        for i, chunk, shape in zip(trainable, vec.split(sizes), shapes):
            params[i] = chunk.reshape(shape)

    def fun(flat):  # type: ignore[no-untyped-def]
        set_flat(flat)
        if cached[0] is not None and (flat == x0).all():
            obj, grads = cached[0]  # the caller's evaluation at x0: the same numbers
        else:
            obj, grads = objective(params)
            evals[0] += 1
        cached[0] = None
        if grads is None:
            return float("inf"), flat * 0.0
        grad = torch.cat([grads[i].reshape(-1) for i in trainable])
        return -float(obj), (-grad).cpu().numpy()

    res = minimize(fun, x0, jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter, "gtol": GTOL, "ftol": FTOL})
    set_flat(res.x)
    return params, -float(res.fun)


def torch_optimise(params: list[Tensor], trainable: list[int], objective: FitObjective,
                    optimizer: str, max_iter: int, lr: float, evals: list[int]) -> list[Tensor]:
    """``torch.optim.LBFGS`` (strong-Wolfe line search) or Adam on the closed-form gradient."""
    params = [p.clone() for p in params]
    leaves = [params[i] for i in trainable]

    def closure() -> Tensor:
        obj, grads = objective(params)
        evals[0] += 1
        if grads is None:
            raise FloatingPointError
        for i in trainable:
            params[i].grad = -grads[i]
        return -obj

    if optimizer == "torch-lbfgs":
        opt: torch.optim.Optimizer = torch.optim.LBFGS(
            leaves, lr=1.0, max_iter=max_iter, history_size=10, line_search_fn="strong_wolfe",
            tolerance_grad=1e-5, tolerance_change=1e-9)
        try:
            opt.step(closure)
        except FloatingPointError:
            pass
    else:
        opt = torch.optim.Adam(leaves, lr=lr)
        for _ in range(max_iter):
            try:
                closure()
            except FloatingPointError:
                break
            opt.step()
    return params


def warm_bfgs(params: list[Tensor], trainable: list[int], objective: FitObjective,
              max_iter: int, evals: list[int],
              inv_hessian: Tensor | None = None) -> tuple[list[Tensor], Tensor | None, float]:
    """Minimise ``−objective`` by dense BFGS from ``params``, starting from the inverse-Hessian
    approximation ``inv_hessian`` ``[p, p]`` (``p`` trainable entries; ``None`` or a wrong shape:
    the scaled identity after the first step, as L-BFGS-B). Returns the parameters and the final
    approximation (for the next fit) and the objective there."""
    params = [q.clone() for q in params]
    shapes = [params[i].shape for i in trainable]
    sizes = [params[i].numel() for i in trainable]

    def unpack(vec: Tensor) -> list[Tensor]:
        out = list(params)
        for i, chunk, shape in zip(trainable, vec.split(sizes), shapes):
            out[i] = chunk.reshape(shape)
        return out

    def fg(vec: Tensor) -> tuple[float, Tensor | None]:
        obj, grads = objective(unpack(vec))
        evals[0] += 1
        if grads is None:
            return math.inf, None
        return -float(obj), -torch.cat([grads[i].reshape(-1) for i in trainable])

    x = torch.cat([params[i].reshape(-1) for i in trainable])
    p = x.numel()
    h = inv_hessian.to(x) if inv_hessian is not None and inv_hessian.shape == (p, p) else None
    f, g = fg(x)
    if g is None:
        return params, None, -math.inf
    for _ in range(max_iter):
        if float(g.abs().max()) <= GTOL:
            break
        d = -(h @ g) if h is not None else -g / max(float(g.norm()), 1.0)
        if h is not None and float(g @ d) >= 0.0:  # not a descent direction: steepest descent
            h, d = None, -g / max(float(g.norm()), 1.0)
        d = d * min(1.0, MAX_STEP / float(d.abs().max()))
        slope = float(g @ d)
        step, accepted = 1.0, False
        for _ in range(10 if h is not None else 30):  # backtracking (Armijo, c = 1e-4)
            f_new, g_new = fg(x + step * d)
            if g_new is not None and f_new <= f + 1e-4 * step * slope:
                accepted = True
                break
            step *= 0.5
        if not accepted or g_new is None:
            if h is None:
                break
            h = None  # the carried curvature misleads here: forget it, retry steepest descent
            continue
        s, y = step * d, g_new - g
        sy = float(s @ y)
        if sy > 1e-12 * float(s.norm() * y.norm()):
            if h is None:
                h = (sy / float(y @ y)) * torch.eye(p, dtype=x.dtype, device=x.device)
            rho = 1.0 / sy
            hy = h @ y
            h = h - rho * (torch.outer(s, hy) + torch.outer(hy, s)) \
                + (rho * rho * float(y @ hy) + rho) * torch.outer(s, s)
        decrease = (f - f_new) / max(abs(f), abs(f_new), 1.0)
        x, f, g = x + s, f_new, g_new
        if decrease <= FTOL and step == 1.0:  # a backtracked tiny step is no convergence
            break
    return unpack(x), h, -f
