"""Separately built modules for the user-program tests: each its own ``cache`` buffer under one name."""

from __future__ import annotations

import torch


class Cache(torch.nn.Module):
    """A separately built module with a buffer ``cache``, which its forward writes or only reads."""

    def __init__(self, start: float, writes: bool) -> None:
        super().__init__()
        self.register_buffer("cache", torch.full((4,), start))
        self.writes = writes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.writes:
            self.cache.add_(x)
        return x + self.cache
