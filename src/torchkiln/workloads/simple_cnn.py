"""The `simple` workload's model, a module-level class (imported once torch is wanted): a
compiled function saved by `kiln ship` names the model's type, which a class local to a
function cannot be named by in another process."""

from __future__ import annotations

import torch
from torch import nn


class Simple(nn.Module):
    """conv3x3 3->64, BN, ReLU, conv3x3 64->128, BN, ReLU, global avg-pool, linear."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.Conv2d(64, 128, 3, padding=1, bias=False),
            nn.BatchNorm2d(128),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))
