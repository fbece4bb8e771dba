"""Factories for the CLI tests: a tiny CNN with BatchNorm and Dropout, and one that raises."""

from __future__ import annotations

import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
            nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.Hardswish(),
            nn.Conv2d(8, 16, 1), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(torch.flatten(self.pool(self.features(x)), 1)))


def tiny() -> nn.Module:
    torch.manual_seed(0)
    model = TinyNet()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so folding them is really exercised
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model.eval()


def broken() -> nn.Module:
    raise RuntimeError("factory exploded on purpose")


class TinySeg(nn.Module):
    """A small U-Net-like segmenter: a skip connection concatenated after a nearest-neighbour upsampling (its
    producer, the first block, also feeds the next conv) and a bilinear upsampling added to a skip."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.c2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.c3 = nn.Sequential(nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.mid = nn.Conv2d(32, 16, 1)
        self.head = nn.Conv2d(32, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.c1(x)
        b = self.c2(a)
        u = nn.functional.interpolate(self.c3(b), scale_factor=2.0, mode="bilinear", align_corners=False)
        u = nn.functional.interpolate(self.mid(u + b), size=[a.shape[2], a.shape[3]], mode="nearest")
        return self.head(torch.cat([u, a], 1))


def tinyseg() -> nn.Module:
    torch.manual_seed(0)
    model = TinySeg()
    return _with_statistics(model)


class TinyDense(nn.Module):
    """A DenseNet-like block: each feature feeds every later concatenation (the first a one-input one), after an
    average pool (a transition)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 1))
        self.pool = nn.AvgPool2d(2)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(8 + 4 * i), nn.ReLU(), nn.Conv2d(8 + 4 * i, 4, 3, padding=1))
            for i in range(3))
        self.fc = nn.Linear(20, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [self.pool(self.stem(x))]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return self.fc(torch.cat(features, 1).mean((2, 3)))


def tinydense() -> nn.Module:
    torch.manual_seed(0)
    model = TinyDense()
    return _with_statistics(model)


def _with_statistics(model: nn.Module) -> nn.Module:
    """``model`` in eval mode with non-trivial BatchNorm running statistics (folding them is then really
    exercised)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


class TinySeq(nn.Module):
    """An OCR recognizer's shape: convs, the width as a sequence, and a Linear over the (B, T, C) sequence (which ORT
    fuses into Reshape -> Gemm -> Reshape)."""

    def __init__(self) -> None:
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d((1, 8)))
        self.fc = nn.Linear(16, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.cnn(x).squeeze(2).permute(0, 2, 1))


def tinyseq() -> nn.Module:
    torch.manual_seed(0)
    return TinySeq()


class LearnableAffine(nn.Module):
    """PP-LCNetV3's learnable affine block: one learned scale and shift, y = scale * x + bias."""

    def __init__(self, scale: float, bias: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([scale]))
        self.bias = nn.Parameter(torch.tensor([bias]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x + self.bias


class TinyAffine(nn.Module):
    """Convs each followed by a learnable affine block (and one after its activation), as PP-LCNetV3 has them."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), LearnableAffine(2.1, 1.05), nn.Hardswish(),
            LearnableAffine(0.18, -0.2), nn.Conv2d(8, 16, 1), LearnableAffine(0.7, 0.3), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def tinyaffine() -> nn.Module:
    torch.manual_seed(0)
    return TinyAffine().eval()


class TinyPrelu(nn.Module):
    """MTCNN's head in small: a PReLU after a Linear layer, on a 2-D tensor (ExecuTorch's XNNPACK lowering refused
    it: ``npukit.runtime.executorch_prelu``), beside a PReLU after a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.act = nn.PReLU(8)
        self.pool = nn.MaxPool2d(8)  # 16x16 -> 2x2, as ONet's pools (XNNPACK takes no adaptive pool to 2x2)
        self.dense = nn.Linear(32, 16)
        self.dense_act = nn.PReLU(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dense_act(self.dense(torch.flatten(self.pool(self.act(self.conv(x))), 1))))


def tinyprelu() -> nn.Module:
    torch.manual_seed(0)
    model = TinyPrelu().eval()
    with torch.no_grad():  # slopes apart from PReLU's default 0.25, one per channel
        for act in (model.act, model.dense_act):
            act.weight.copy_(torch.linspace(0.05, 0.6, act.weight.numel()))
    return model


class TinyHeads(nn.Module):
    """Twelve outputs of twelve sizes from one trunk (a detector's per-level heads): more than ten, which LiteRT's
    interpreter lists with their names sorted as text."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
        self.heads = nn.ModuleList([nn.Conv2d(8, i + 1, 1) for i in range(12)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features = self.trunk(x)
        return tuple(head(features).mean(dim=(2, 3)) for head in self.heads)


def tinyheads() -> nn.Module:
    torch.manual_seed(0)
    return TinyHeads().eval()


class TinyArgmax(nn.Module):
    """Scores and their argmax: an integer output beside a float one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))
        return scores, scores.argmax(dim=1)


def tinyargmax() -> nn.Module:
    torch.manual_seed(0)
    return TinyArgmax().eval()


class TinyDead(nn.Module):
    """A classifier whose features die at a ReLU for every input (an untrained googlenet's case): its logits are the
    last layer's bias, whatever the input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, 5)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.bias.fill_(-1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def tinydead() -> nn.Module:
    torch.manual_seed(0)
    return TinyDead().eval()


class TinyCatOut(nn.Module):
    """Two conv heads of different ranges concatenated as the model's output (a detector's boxes over its levels):
    the plan leaves the output float, while LiteRT's converter wants an int8 concatenation's inputs and output on
    one grid."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.a, self.b = nn.Conv2d(8, 4, 3, padding=1), nn.Conv2d(8, 2, 3, padding=1)
        with torch.no_grad():
            self.b.weight.mul_(3.0)  # its output spans three times a's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        return torch.cat([self.a(x), self.b(x)], 1)


def tinycatout() -> nn.Module:
    torch.manual_seed(0)
    return TinyCatOut().eval()


class OnnxDrift(nn.Module):
    """A conv whose ONNX export computes 1% more than eager torch (as an exporter's decomposition can drift): the
    export check refuses the .onnx; the verbs that export on the side note it and check their own artifact."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y * 1.01 if torch.onnx.is_in_onnx_export() else y


def drift() -> nn.Module:
    torch.manual_seed(0)
    return OnnxDrift().eval()
