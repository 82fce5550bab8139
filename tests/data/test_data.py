"""The synthetic dataset and the collates."""

import math
import os

import numpy as np
import pytest
import torch

from core.errors import UserError
from data import SyntheticFaces, collate_list, collate_padded
from data.synthetic import uniform_bytes


def test_deterministic_per_seed_and_index():
    a, b = SyntheticFaces(100, 64, seed=3), SyntheticFaces(100, 64, seed=3)
    for i in (0, 7, 99):
        assert torch.equal(a[i][0], b[i][0]) and torch.equal(a[i][1], b[i][1])
    other = SyntheticFaces(100, 64, seed=4)
    assert not torch.equal(a[7][0], other[7][0])
    assert not torch.equal(a[7][0], a[8][0])


def _expected_count_pmf(k: int, sigma: float = 3.0) -> float:
    """P(floor(|N(0, sigma)|) = k) = P(k <= |X| < k+1)."""
    cdf = lambda x: math.erf(x / (sigma * math.sqrt(2)))  # P(|X| < x)
    return cdf(k + 1) - cdf(k)


@pytest.mark.parametrize("shape", [(1, 256, 256), (1, 64, 64), (1, 7, 7), (1, 2, 2), (8,)])
def test_uniform_bytes_are_integers_bytes_and_leave_the_generator_where_it_does(shape):
    # Fresh (seed, index) pairs each run; 7x7 and 2x2 are not a multiple of 8 (slow path).
    for seed, index in np.random.default_rng().integers(0, 2**31, size=(20, 2)).tolist():
        slow, fast = np.random.default_rng([seed, index]), np.random.default_rng([seed, index])
        assert np.array_equal(slow.integers(0, 256, size=shape, dtype=np.uint8),
                              uniform_bytes(fast, shape))
        assert slow.standard_normal() == fast.standard_normal()
        assert np.array_equal(slow.integers(0, 255, size=(3, 2)),
                              fast.integers(0, 255, size=(3, 2)))


def test_the_images_are_the_workloads_draw():
    """The dataset's images are still `integers(0, 256, uint8)` of each sample's generator:
    every recorded run saw these bytes."""
    faces = SyntheticFaces(10, 256, seed=5)
    for i in (0, 9):
        rng = np.random.default_rng([5, i])
        expected = rng.integers(0, 256, size=(1, 256, 256), dtype=np.uint8)
        assert np.array_equal(faces[i][0].numpy(), expected)


def test_box_counts_follow_the_workload_distribution():
    ds = SyntheticFaces(1_000_000, image_size=16, seed=0)  # counts don't depend on size
    counts = torch.tensor([ds[i][1].shape[0] for i in range(20_000)], dtype=torch.float64)
    expected_mean = sum(k * _expected_count_pmf(k) for k in range(60))
    # floor(|N(0,3)|) has mean 1.915; |N(0,3)| itself has 3*sqrt(2/pi) = 2.394.
    assert expected_mean == pytest.approx(1.915, abs=1e-3)
    assert counts.mean().item() == pytest.approx(expected_mean, abs=0.06)  # ~4 std errors
    for k in range(4):
        share = (counts == k).double().mean().item()
        assert share == pytest.approx(_expected_count_pmf(k), abs=0.015)
    assert counts.max() <= 255


@pytest.mark.parametrize("size", (16, 64, 256))
def test_boxes_are_valid_uint8_pixel_boxes(size):
    ds = SyntheticFaces(1000, image_size=size, seed=1)
    for i in range(200):
        image, boxes = ds[i]
        assert image.shape == (1, size, size) and image.dtype == torch.uint8
        assert boxes.dtype == torch.uint8 and boxes.shape[1] == 4
        b = boxes.long()
        assert (b[:, :2] <= size - 2).all() and (b[:, 2:] <= size - 1).all()
        assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()


def test_image_size_out_of_range_is_a_clear_error():
    with pytest.raises(UserError, match="out of range"):
        SyntheticFaces(10, image_size=512)


def _samples():
    image = torch.zeros(1, 8, 8, dtype=torch.uint8)
    boxes = [torch.randint(0, 255, (n, 4), dtype=torch.uint8) for n in (0, 3, 5)]
    return [(image + i, b) for i, b in enumerate(boxes)]


def test_collate_padded_pads_with_zeros_and_counts_in_int32():
    samples = _samples()
    images, (padded, counts) = collate_padded(samples, capacity=6)
    assert images.shape == (3, 1, 8, 8)
    assert padded.shape == (3, 6, 4) and padded.dtype == torch.uint8
    assert counts.dtype == torch.int32 and counts.tolist() == [0, 3, 5]
    for row, (_, boxes) in enumerate(samples):
        assert torch.equal(padded[row, :len(boxes)], boxes)
        assert (padded[row, len(boxes):] == 0).all()


def test_collate_list_keeps_per_sample_tensors():
    samples = _samples()
    images, targets = collate_list(samples, capacity=6)
    assert [t.shape[0] for t in targets] == [0, 3, 5]
    assert all(torch.equal(t, b) for t, (_, b) in zip(targets, samples))


@pytest.mark.parametrize("collate", (collate_list, collate_padded))
def test_too_many_boxes_names_the_sample(collate):
    with pytest.raises(UserError, match="sample 2 of the batch has 5 boxes .* only 4"):
        collate(_samples(), capacity=4)


def test_a_workers_fd_server_is_quiet_when_the_main_process_hangs_up():
    """The worker's excepthook drops a hang-up in multiprocessing's resource sharer (the
    main process ending mid-fetch) and reports anything else."""
    from data.loader import _quiet_hang_ups
    code = compile("def _serve():\n    raise EOFError('hung up')\n",
                   "/usr/lib/python3.11/multiprocessing/resource_sharer.py", "exec")
    scope = {}
    exec(code, scope)
    reported = []

    def report(*exc_info):
        reported.append(exc_info[0])

    for raise_it, expected in ((scope["_serve"], []), (lambda: 1 / 0, [ZeroDivisionError])):
        reported.clear()
        try:
            raise_it()
        except BaseException:
            import sys
            _quiet_hang_ups(*sys.exc_info(), report=report)
        assert reported == expected


def test_a_batch_over_capacity_names_its_largest_sample():
    """The hint named the first sample that did not fit, so a user raised
    --max-boxes once per sample; it names the batch's largest now."""
    from core.errors import UserError
    from data.collate import check_capacity
    samples = [(None, torch.zeros(n, 4, dtype=torch.uint8)) for n in (0, 3, 7, 2)]
    with pytest.raises(UserError, match="sample 1 of the batch has 3 boxes but the model "
                       "predicts only 2: raise --max-boxes to at least 7 \\(this batch's "
                       "largest\\)"):
        check_capacity(samples, 2)


def test_a_worker_outlives_a_group_sigterm_that_comes_before_its_handlers():
    """A SIGTERM to the whole group in the moment after a data worker forked, before its
    init set its handlers, killed it by PyTorch's C handler (set first in the worker
    loop), and the main process raised "worker killed by signal" inside the loader's
    start (the fork test, 5 in 457 tries). Forked under stop_signals_held(forks=True), the
    worker holds it until its own handler takes it, and lives."""
    import os
    import signal

    from core.signals import stop_signals_held
    from data.loader import _worker_init

    init = _worker_init(None)
    ready_r, ready_w = os.pipe()
    sent_r, sent_w = os.pipe()
    with stop_signals_held(forks=True):
        pid = os.fork()
        if pid == 0:  # the worker: PyTorch's handler first, which dies of a SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.write(ready_w, b"x")
            os.read(sent_r, 1)  # the SIGTERM is on its way: its handlers come after it
            init(0)
            os._exit(0)
        assert os.read(ready_r, 1) == b"x"
        os.kill(pid, signal.SIGTERM)  # between its fork and its own handlers
        os.write(sent_w, b"x")
    for fd in (ready_r, ready_w, sent_r, sent_w):
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the worker died of the SIGTERM"


def test_a_loaders_workers_make_no_temp_folder_of_their_own(tmp_path):
    """Each worker made its own multiprocessing folder (pymp-*, the socket of its first
    batch's file descriptors), which a worker ended without its finalizers (os._exit on
    the main process's exit, or its parent's death) left behind. They share the main
    process's, removed at its exit. In a process of its own: this one's may exist already
    (an earlier test's loader), and its workers would inherit it without the fix."""
    import subprocess
    import sys

    from tests.helpers import REPO
    script = (
        "import multiprocessing.util, pathlib, sys, losses\n"
        "from data import SyntheticFaces\n"
        "from data.loader import make_loader\n"
        "collate = losses.get('padded', capacity=64).collate\n"
        "batches = iter(make_loader(SyntheticFaces(64, 32, seed=11), 8, 2, collate, "
        "pin_memory=False))\n"
        "for _ in range(4): next(batches)  # both workers have served a batch\n"
        "found = sorted(str(p) for p in pathlib.Path(sys.argv[1]).glob('pymp-*'))\n"
        "batches._shutdown_workers()\n"
        "print(found == [multiprocessing.util.get_temp_dir()], found)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO,
                          env={**os.environ, "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True"), done.stdout
    assert list(tmp_path.iterdir()) == [], "the main process's folder outlived it"
