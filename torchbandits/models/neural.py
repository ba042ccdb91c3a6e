"""ReLU network, its empirical-NTK feature map and TrainNN (Hong, Li & Tewari, AISTATS 2023, §5.1,
Algorithm 6).

The bias-free ReLU MLP ``net(x) = W_out σ(W_L σ(⋯ σ(W_1 x)))`` has an input layer ``d → m``,
``n_square_layers`` layers ``m → m`` and an output layer ``m → 1``; every weight is i.i.d.
``N(0, 2/m)``. The paper's depth ``L`` counts all matrices (``n_square_layers = L − 2``); the
authors' code uses ``L`` square layers (``n_square_layers = L``, the default for reproduction).
The model is ``f(x; W) = √m · net(x; W)`` and the algorithm's features are
``g(x; W)/√m = ∇_W net(x; W)`` (§5.1).

**NTK Gram without per-arm gradients.** With ``h_{l−1}`` the input of layer ``l``,
``z_l = W_l h_{l−1}`` and ``b_l = ∂net/∂z_l`` (``b_out = 1``, ``b_l = (W_{l+1}ᵀ b_{l+1}) ⊙ 1{z_l > 0}``),
``∇_{W_l} net = b_l h_{l−1}ᵀ`` and therefore

``K^W(x, x') = Σ_l (b_l(x)ᵀ b_l(x')) · (h_{l−1}(x)ᵀ h_{l−1}(x'))``

— ``O(N² m L)`` time and ``O(N m L)`` memory, exact, instead of the ``N × p`` gradient matrix
(≈ 5 GB at ``N = 100``, ``m = 2048``). The network runs in float32 by default; the Gram is
accumulated in float64.

**TrainNN (Algorithm 6).** Full-batch gradient descent from ``W⁽⁰⁾`` on
``½ Σ_t (f(x_t; W) − y_t)² + (mλ/2)‖W − W⁽⁰⁾‖²``, aggregated by arm
(``Σ_t (f(x_t) − y_t)² = Σ_a n_a (f(a) − ȳ_a)² + const``), ``J`` steps of size ``η``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["ReLUNetwork", "ntk_gram", "train_nn"]


class ReLUNetwork(nn.Module):
    """Bias-free ReLU MLP with ``N(0, 2/m)`` weights; ``forward`` returns ``f = √m · net``."""

    def __init__(self, dim: int, width: int = 2048, n_square_layers: int = 3, *,
                 generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if int(dim) < 1 or int(width) < 1 or int(n_square_layers) < 0:
            raise ValueError(f"need dim >= 1, width >= 1, n_square_layers >= 0; got "
                             f"{dim}, {width}, {n_square_layers}")
        self.dim, self.width, self.n_square_layers = int(dim), int(width), int(n_square_layers)
        shapes = [(self.width, self.dim)] + [(self.width, self.width)] * self.n_square_layers
        shapes.append((1, self.width))
        std = math.sqrt(2.0 / self.width)
        self.weights = nn.ParameterList()
        for shape in shapes:
            w = torch.randn(*shape, generator=generator, dtype=torch.float32) * std
            self.weights.append(nn.Parameter(w.to(dtype=dtype, device=device)))

    @property
    def n_params(self) -> int:
        """Number of trainable weights ``p`` (the length of :meth:`flat` and of a gradient feature)."""
        return sum(w.numel() for w in self.weights)

    def net(self, x: Tensor) -> Tensor:
        """``net(x)`` (without the ``√m``) for ``x`` of shape ``[n, d]`` → ``[n]``."""
        h = x.to(self.weights[0].dtype)
        n_layers = len(self.weights)
        for i in range(n_layers - 1):          # index access keeps torch.func.functional_call working
            h = torch.relu(h @ self.weights[i].T)
        return (h @ self.weights[n_layers - 1].T).squeeze(-1)

    def forward(self, x: Tensor) -> Tensor:
        return math.sqrt(self.width) * self.net(x)

    def flat(self) -> Tensor:
        """All weights, detached, as one vector ``[p]`` (the order of the gradient features)."""
        return torch.cat([w.detach().flatten() for w in self.weights])


@torch.no_grad()
def ntk_gram(model: ReLUNetwork, x: Tensor, *, dtype: torch.dtype = torch.float64,
             chunk: int = 512) -> Tensor:
    """``K^W = ∇net ∇netᵀ`` on the rows of ``x`` by the per-layer identity (module docstring).

    Equals ``G Gᵀ / m`` with ``G`` the stacked gradients of ``f = √m·net``.
    """
    ws = [w.detach() for w in model.weights]
    n = x.shape[0]
    out = torch.zeros(n, n, dtype=dtype, device=x.device)
    h = x.to(ws[0].dtype)
    inputs = [h]        # h_{l−1} for every layer l
    masks = []          # 1{z_l > 0} for the hidden layers
    for w in ws[:-1]:
        z = h @ w.T
        masks.append(z > 0)
        h = torch.relu(z)
        inputs.append(h)
    # output layer: b = 1
    hh = inputs[-1].to(dtype)
    out += hh @ hh.T
    b = ws[-1].expand(n, -1)                       # ∂net/∂h_L = W_outᵀ, shape [n, m]
    for layer in range(len(ws) - 2, -1, -1):
        b = b * masks[layer]                       # b_l = ∂net/∂z_l
        hin = inputs[layer].to(dtype)
        bb = b.to(dtype)
        out += (bb @ bb.T) * (hin @ hin.T)
        if layer > 0:
            b = b @ ws[layer]                      # ∂net/∂h_{l−1} = W_lᵀ b_l
    return 0.5 * (out + out.T)


def train_nn(model: ReLUNetwork, init: list[Tensor], arms: Tensor, counts: Tensor, sums: Tensor,
             *, lam: float, eta: float, steps: int) -> ReLUNetwork:
    """Algorithm 6: reset ``model`` to ``init`` (``W⁽⁰⁾``) and run ``steps`` full-batch GD steps on
    ``½ Σ_a n_a (f(a) − ȳ_a)² + (mλ/2)‖W − W⁽⁰⁾‖²`` (``counts = n_a``, ``sums = Σ y`` per arm).

    Returns the model (trained in place). ``steps = 0`` returns ``W⁽⁰⁾`` exactly.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    with torch.no_grad():
        for w, w0 in zip(model.weights, init, strict=True):
            w.copy_(w0)
    if steps == 0:
        return model
    played = counts > 0
    xa = arms[played].to(model.weights[0].dtype)
    na = counts[played].to(model.weights[0].dtype)
    ya = (sums[played] / counts[played]).to(model.weights[0].dtype)
    reg = model.width * lam
    for _ in range(int(steps)):
        for w in model.weights:
            w.grad = None
        with torch.enable_grad():      # policies update under no_grad
            resid = model(xa) - ya
            loss = 0.5 * (na * resid * resid).sum()
            loss.backward()
        with torch.no_grad():
            for w, w0 in zip(model.weights, init, strict=True):
                w -= eta * (w.grad + reg * (w - w0))
    for w in model.weights:
        w.grad = None
    return model


def train_loss(model: ReLUNetwork, init: list[Tensor], arms: Tensor, counts: Tensor, sums: Tensor,
               sq_sums: Tensor, lam: float) -> float:
    """The full TrainNN loss ``½ Σ_t (f(x_t) − y_t)² + (mλ/2)‖W − W⁽⁰⁾‖²`` (``sq_sums = Σ y²``)."""
    with torch.no_grad():
        f = model(arms).double()
        fit = 0.5 * float((counts * f * f - 2.0 * f * sums + sq_sums).sum())
        ridge = sum(float(((w.double() - w0.double()) ** 2).sum())
                    for w, w0 in zip(model.weights, init, strict=True))
    return fit + 0.5 * model.width * lam * ridge
