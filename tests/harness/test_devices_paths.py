"""The GPU paths against the CPU's: most tests run on the CPU everywhere (so their own logic is
checked on every machine) and again on CUDA where a GPU is present (the `tests` step of
tests/benchmarks/gpu_checks.sh runs them there). On CUDA they check what a CPU cannot:
training in float32 matches the CPU's within TF32 rounding, bf16 autocast on a channels-last
CNN, pinned batches from worker processes, nvJPEG's pixels against PIL's, compiled steps,
and the kNN metrics above faiss's threshold, where `auto` picks the GPU's own top-K."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from jpeg_tree import cub_jpegs
from tiny_training import fresh_contrastive, tiny_images

from harness.core import OpSpec, RunContext, load_protocol
from harness.data import Feeder, LazyImages, TrainPipeline
from harness.evaluate import MetricOptions, compute_metrics
from harness.train import Model, TrainingSet, train

CPU = torch.device("cpu")
DEVICES = [
    pytest.param(CPU, id="cpu"),
    pytest.param(torch.device("cuda"), id="cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device")),
]  # fmt: skip


def _smoke(steps: int, **changes):
    protocol = load_protocol("smoke")
    budget = dataclasses.replace(protocol.budget, steps=steps)
    return (dataclasses.replace(protocol, budget=budget, **changes), *tiny_images())


def _trained(protocol, images, labels, device, compile: bool = False):
    backbone, method = fresh_contrastive(protocol)
    backbone.to(device), method.head.to(device), method.loss.to(device)
    ctx = RunContext(protocol, 0, device, workers=0, compile=compile)
    stats = train(ctx, Model(backbone, method), TrainingSet(images, labels))
    return stats, {k: v.detach().cpu() for k, v in backbone.state_dict().items()}


@pytest.mark.parametrize("device", DEVICES[1:])
def test_training_on_the_device_follows_the_cpu(device):
    """float32: the same losses and weights as on the CPU within TF32's rounding (CUDA's
    convolutions use TF32 by default), after 6 steps. (CUDA only: on the CPU it would compare
    the CPU with itself.)"""
    protocol, images, labels = _smoke(6)
    cpu_stats, cpu_weights = _trained(protocol, images, labels, CPU)
    stats, weights = _trained(protocol, images, labels, device)
    assert stats.steps == cpu_stats.steps == 6
    assert np.allclose(stats.epoch_loss, cpu_stats.epoch_loss, rtol=2e-2)
    assert all(torch.allclose(weights[k].float(), cpu_weights[k].float(), atol=2e-2)
               for k in cpu_weights)  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_on_a_channels_last_cnn(device):
    """The fair protocols' fast path: autocast bf16 convolutions on channels-last inputs,
    float32 master weights and loss."""
    protocol, images, labels = _smoke(4, precision="bf16")
    protocol = dataclasses.replace(
        protocol, backbone=dataclasses.replace(protocol.backbone, channels_last=True)
    )
    backbone, method = fresh_contrastive(protocol)
    backbone.channels_last = True
    backbone.to(device, memory_format=torch.channels_last), method.head.to(device)
    method.loss.to(device)
    seen: set = set()
    conv = next(m for m in backbone.modules() if isinstance(m, torch.nn.Conv2d))
    conv.register_forward_hook(  # autocast casts inside the op: the output shows bf16
        lambda m, args, out: seen.add(
            (out.dtype, args[0].is_contiguous(memory_format=torch.channels_last))
        )  # fmt: skip
    )
    stats = train(RunContext(protocol, 0, device, workers=0), Model(backbone, method),
                  TrainingSet(images, labels))  # fmt: skip
    assert all(np.isfinite(stats.epoch_loss)) and stats.steps == 4
    assert (torch.bfloat16, True) in seen
    assert all(p.dtype == torch.float32 for p in backbone.parameters())


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> list[str]:
    root = cub_jpegs(tmp_path_factory.mktemp("cub"), train_classes=2, test_classes=1, per_class=4)
    return sorted(str(p) for p in (root / "CUB_200_2011" / "images").rglob("*.jpg"))


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_workers_feed_the_device_the_batches_made_in_process(jpegs, device):
    """2 spawned workers (pinned memory on CUDA) hand over the same augmented batches, in step
    order, as the training process makes itself."""
    images = LazyImages(jpegs, 0)
    augment = TrainPipeline([OpSpec("random_resized_crop", size=32), OpSpec("horizontal_flip")], 1)
    keys = [(n, np.arange(12)[n % 3 :: 3][:4]) for n in range(6)]
    alone = list(Feeder(images, augment, 0).batches(keys))
    feeder = Feeder(images, augment, 2, pin_memory=device.type == "cuda")
    try:
        fed = list(feeder.batches(keys))
    finally:
        feeder.close()
    assert [s for s, _, _ in fed] == list(range(6))
    for (_, _, a), (_, _, b) in zip(alone, fed, strict=True):
        assert torch.equal(a, b) and b.is_pinned() == (device.type == "cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_the_torch_decoder_on_the_device_gives_pils_pixels(jpegs, device):
    """nvJPEG's IDCT and chroma upsampling are not libjpeg's: on CUDA the pixels may differ a
    little (a wrong crop, channel order or orientation would differ by tens of levels)."""
    boxes = np.array([[50.0, 40.0, 300.0, 250.0], [np.nan] * 4] * 6)
    pil = LazyImages(jpegs, 0, boxes).load()
    decoded = LazyImages(jpegs, 0, boxes).decoded_by("torch", device).load()
    for a, b in zip(pil, decoded, strict=True):
        assert b.device.type == device.type and a.shape == b.shape
        diff = (a.int() - b.cpu().int()).abs()
        assert diff.float().mean() < (0.5 if device.type == "cpu" else 4.0)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_metrics_above_the_faiss_threshold_equal_the_cpus(device):
    """21,000 items: `auto` ranks with faiss on the CPU, and on CUDA with faiss's GPU index
    or torch on the GPU; the top-K metrics agree."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 700, 21_000)
    x = rng.normal(size=(700, 24))[labels] + 0.8 * rng.normal(size=(21_000, 24))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    wanted = ["recall@K", "precision@1", "map@r"]
    cpu = compute_metrics(
        x, labels, metrics=wanted, options=MetricOptions(knn_backend="torch", device="cpu")
    )
    auto = compute_metrics(
        x, labels, metrics=wanted, options=MetricOptions(knn_backend="auto", device=device)
    )
    assert auto == pytest.approx(cpu, abs=1e-3)  # a float32 near-tie may swap two neighbours


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES[1:])
def test_a_compiled_step_trains_as_eager_on_the_device(device):
    """Triton's kernels against eager ones (CUDA only: test_compile checks inductor's C++
    kernels on the CPU)."""
    protocol, images, labels = _smoke(6)
    eager, w_eager = _trained(protocol, images, labels, device)
    compiled, w_compiled = _trained(protocol, images, labels, device, compile=True)
    assert compiled.compiled and not eager.compiled
    # Triton's kernels (and TF32 in both) round differently from eager's: float-rounding tolerance
    assert np.allclose(compiled.epoch_loss, eager.epoch_loss, rtol=1e-2, atol=1e-3)
    assert all(torch.allclose(w_compiled[k].float(), w_eager[k].float(), atol=1e-2)
               for k in w_eager)  # fmt: skip


@pytest.mark.parametrize("device", DEVICES[1:])
def test_the_distance_histogram_counts_on_the_device_as_on_the_cpu(device):
    """Counted where the embeddings are (SOP's 1.8e9 pairs stay on the GPU); a pair may
    change bin only by the distance's rounding. (CUDA only: on the CPU it is the same code.)"""
    from harness.evaluate import distance_histogram

    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(3000, 32, generator=g), dim=1)
    y = torch.randint(0, 60, (3000,), generator=g)
    cpu, dev = distance_histogram(x, y), distance_histogram(x.to(device), y.to(device))
    assert dev["edges"] == pytest.approx(cpu["edges"], abs=1e-4)
    for kind in ("positive", "negative"):
        assert sum(dev[kind]) == sum(cpu[kind])
        assert np.abs(np.subtract(dev[kind], cpu[kind])).sum() <= 1e-4 * sum(cpu[kind])
