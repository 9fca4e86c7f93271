"""Kimi K3's "Stable LatentMoE" block in torch (CPU, float32), small shapes.

router over the full hidden state (sigmoid scores, correction bias used for
selection only, top-k, renormalised) -> latent down projection -> routed
experts with SiTU (gate' = b*tanh(gate/b)*sigmoid(gate), b = 4;
linear' = bl*tanh(linear/bl), bl = 25; out = gate' * linear') -> routing
weights applied after each expert's down projection -> optional routed
RMSNorm -> latent up projection -> plus shared experts (SwiGLU, unquantized).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BETA_GATE = 4.0
BETA_LINEAR = 25.0


@dataclass
class BlockWeights:
    router: torch.Tensor        # [E, H]
    correction_bias: torch.Tensor  # [E]
    latent_down: torch.Tensor   # [L, H]
    latent_up: torch.Tensor     # [H, L]
    w13: torch.Tensor           # [E, 2I, L]  gate rows then up rows (vLLM's w13)
    w2: torch.Tensor            # [E, L, I]
    routed_norm: torch.Tensor | None  # [L]
    shared: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (gate [S, H], up [S, H], down [H, S])


def situ(gate: torch.Tensor, linear: torch.Tensor) -> torch.Tensor:
    g = BETA_GATE * torch.tanh(gate / BETA_GATE) * torch.sigmoid(gate)
    lin = BETA_LINEAR * torch.tanh(linear / BETA_LINEAR)
    return g * lin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def forward(x: torch.Tensor, w: BlockWeights, top_k: int) -> torch.Tensor:
    scores = torch.sigmoid(x @ w.router.T)
    chosen = torch.topk(scores + w.correction_bias, top_k, dim=-1).indices
    weights = scores.gather(-1, chosen)
    weights = weights / weights.sum(-1, keepdim=True)
    latent = x @ w.latent_down.T
    intermediate = w.w13.shape[1] // 2
    routed = torch.zeros_like(latent)
    for t in range(x.shape[0]):
        for k in range(top_k):
            e = int(chosen[t, k])
            h = latent[t] @ w.w13[e].T
            out = situ(h[:intermediate], h[intermediate:]) @ w.w2[e].T
            routed[t] += weights[t, k] * out  # routing weight applied late
    if w.routed_norm is not None:
        routed = rms_norm(routed, w.routed_norm)
    y = routed @ w.latent_up.T
    for gate, up, down in w.shared:
        y = y + (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
    return y


def random_dense(experts: int, hidden: int, latent: int, shared: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape, s=0.05: torch.randn(*shape, generator=g) * s  # noqa: E731
    return {
        "router": r(experts, hidden),
        "correction_bias": r(experts, s=0.01),
        "latent_down": r(latent, hidden),
        "latent_up": r(hidden, latent),
        "routed_norm": 1 + r(latent, s=0.1),
        "shared": [(r(shared, hidden), r(shared, hidden), r(hidden, shared)) for _ in range(2)],
    }
