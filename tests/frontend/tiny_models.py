"""Tiny models and factories the frontend tests import by ``module:factory`` spec."""

from __future__ import annotations

import torch


class TinyCNN(torch.nn.Module):
    """Conv -> BatchNorm -> ReLU -> pool -> Linear; declares its input shape for module:factory specs."""

    example_input_shape = (1, 3, 16, 16)

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)
        with torch.no_grad():  # non-trivial running statistics so BatchNorm is not an identity
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean(dim=(2, 3)))


class TwoHeads(torch.nn.Module):
    """Returns a dict holding a tuple: outputs are flattened in order."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        h = self.body(x)
        return {"logits": h, "extra": (torch.tanh(h), h.sum(dim=-1))}


class SignBranch(torch.nn.Module):
    """Python control flow on a tensor value: the dynamo exporter rejects it; traced, it keeps one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if bool(y.sum() > 0):
            return y * 2.0
        return y - 1.0


class BatchMixer(torch.nn.Module):
    """Each sample's output depends on the others in its batch (a batch statistic): traces at any batch size, and
    a batch of two does not give what each sample gives alone."""

    example_input_shape = (1, 6)

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x - x.mean(0, keepdim=True))


def tiny_cnn() -> TinyCNN:
    torch.manual_seed(0)
    return TinyCNN()


def scripted_sign_branch() -> torch.nn.Module:
    """TorchScript keeps the branch as an ONNX If node; torch.export cannot take a ScriptModule at all."""
    torch.manual_seed(0)
    return torch.jit.script(SignBranch().eval())


def broken_factory() -> torch.nn.Module:
    raise RuntimeError("checkpoint layout v3 is not supported\nsecond line of detail")


def not_a_module() -> dict[str, int]:
    return {"layers": 3}
