"""The smallest stand-ins that let a reference checkout import and run on this CPU machine.

There is no torchvision build here that loads beside torch 2.13 (CPU). The FedBug authors' code
(IandRover/FedBug) imports it at module level but, on the path the harness drives, touches only:

* ``torchvision.transforms.Compose`` and ``ToTensor`` (``utils_dataset.Dataset`` wraps each
  float32 CHW image: ``np.moveaxis`` to HWC, then ``ToTensor`` back to CHW; for a float array
  ToTensor only transposes, it divides by 255 for uint8 only);
* the names ``torchvision.datasets.ImageFolder`` and ``DatasetFolder`` (subclassed at import in
  ``utils_dataset_tinyimagenet.py``, never instantiated here);
* ``torchvision.models.resnet18`` / ``resnet34`` (``utils_models.py``), written below from
  torchvision's own definition (``torchvision/models/resnet.py``: BasicBlock, a 7x7 stride-2
  stem with max-pool, four stages, average pool, FC; the names ``conv1``, ``bn1``, ``layer1``..
  ``layer4``, ``downsample``, ``fc``, which the reference's ``utils_gu.py`` addresses).

Nothing else of torchvision exists in the stand-in: any other use fails loudly. The device is
the CPU (the harness builds the reference's ``args`` itself, with ``device = cpu``; the code
paths it drives call ``.to(args.device)`` only).

PFLlib (TsingZ0/PFLlib) imports ``h5py`` at module level in ``flcore/servers/serverbase.py``
and uses it only in ``Server.save_results``, to write the accuracy curves to an HDF5 file; h5py
is not installed here. :func:`install_h5py` puts a stand-in ``h5py`` whose ``File`` keeps what is
written in memory (``WRITTEN``) and writes no file.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import numpy as np
import torch
from torch import nn


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    """torchvision's ToTensor for a numpy HWC array: CHW tensor, /255 only for uint8."""

    def __call__(self, pic):
        if not isinstance(pic, np.ndarray):
            raise TypeError("the torchvision stand-in's ToTensor takes numpy arrays only")
        img = torch.from_numpy(np.ascontiguousarray(pic.transpose((2, 0, 1))))
        if img.dtype == torch.uint8:
            return img.float().div(255)
        return img


class _NotHere:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision.datasets is not available in the harness's stand-in")


class DatasetFolder(_NotHere):
    pass


class ImageFolder(DatasetFolder):
    pass


# -- torchvision.models.resnet, BasicBlock only ---------------------------------------------
def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, norm_layer=None):
        super().__init__()
        norm_layer = norm_layer or nn.BatchNorm2d
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers, num_classes=1000, norm_layer=None):
        super().__init__()
        self._norm_layer = norm_layer or nn.BatchNorm2d
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = self._norm_layer(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                self._norm_layer(planes),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample, self._norm_layer)]
        self.inplanes = planes
        for _ in range(1, blocks):
            layers.append(BasicBlock(planes, planes, norm_layer=self._norm_layer))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(**kwargs):
    return ResNet([2, 2, 2, 2], **kwargs)


def resnet34(**kwargs):
    return ResNet([3, 4, 6, 3], **kwargs)


class H5File:
    """``h5py.File(path, "w")`` as ``Server.save_results`` uses it: a context manager with
    ``create_dataset(name, data=...)``; the datasets land in ``WRITTEN[path]``."""

    WRITTEN: dict[str, dict[str, object]] = {}

    def __init__(self, path, mode="r"):
        if mode != "w":
            raise RuntimeError("the harness's h5py stand-in only writes")
        self.datasets = H5File.WRITTEN.setdefault(str(path), {})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def create_dataset(self, name, data=None):
        self.datasets[name] = np.asarray(data)


def install_h5py() -> None:
    """Put the stand-in ``h5py`` (only ``File`` for writing) in ``sys.modules``."""
    h5 = types.ModuleType("h5py")
    h5.__doc__ = "fedbug equivalence harness stand-in (benchmarks/equivalence/shims.py)"
    h5.File = H5File
    sys.modules["h5py"] = h5


def install_tqdm() -> None:
    """Put a stand-in ``tqdm`` (``tqdm(iterable)`` gives the iterable back, no bar) in
    ``sys.modules`` unless the real one is there (k1l1's CoCoFL and SLT import it)."""
    if "tqdm" in sys.modules:
        return
    stand_in = types.ModuleType("tqdm")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("tqdm", None)  # torch looks it up
    stand_in.tqdm = lambda iterable=None, *a, **k: iterable  # type: ignore[attr-defined]
    sys.modules["tqdm"] = stand_in


def install_torchvision() -> None:
    """Put the stand-in ``torchvision`` (and its three submodules) in ``sys.modules``."""
    tv = types.ModuleType("torchvision")
    tv.__doc__ = "fedbug equivalence harness stand-in (benchmarks/equivalence/shims.py)"
    transforms = types.ModuleType("torchvision.transforms")
    transforms.Compose = Compose
    transforms.ToTensor = ToTensor
    datasets = types.ModuleType("torchvision.datasets")
    datasets.ImageFolder = ImageFolder
    datasets.DatasetFolder = DatasetFolder
    models = types.ModuleType("torchvision.models")
    models.resnet18 = resnet18
    models.resnet34 = resnet34
    tv.transforms, tv.datasets, tv.models = transforms, datasets, models
    sys.modules.update(
        {
            "torchvision": tv,
            "torchvision.transforms": transforms,
            "torchvision.datasets": datasets,
            "torchvision.models": models,
        }
    )
