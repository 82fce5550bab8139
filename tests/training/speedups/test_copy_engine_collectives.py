"""--copy-engine-collectives: where it applies (tp alone), that it idles the carveout it
makes needless, and that each run gets the collectives of its own choice. The copies
themselves need two GPUs on NVLink: on NCCL ranks their losses are NCCL's
(tests/training/test_gpu_distributed.py)."""

from training import peer_copies, speedups, tensor_parallel
from training.speedups import copy_engine_collectives as ce
from training.speedups.base import Asked


def _asked(design: str, world: int = 1, **values) -> Asked:
    every = {s.name: s.default for s in speedups.SPEEDUPS}
    every.update(values)
    return Asked(values=every, loss="kernel", mode="train", amp=True, wait=1, design=design,
                 world=world)


def test_only_tp_moves_its_collectives_by_copy_engine():
    assert ce.refusal(_asked("tp"), cuda=True) is None
    for design in ("ddp", "zero", "tp2d"):
        assert "only --parallel tp" in ce.refusal(_asked(design), cuda=True)
    assert ce.SPEEDUP.why_not(_asked("tp"), cuda=False) == "needs a CUDA GPU"


def test_it_stays_inside_one_host(monkeypatch):
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")  # torchrun's hosts
    assert ce.refusal(_asked("tp", world=2), cuda=True) == (
        "moves rows between one host's GPUs: this job spans 2 hosts")


def test_on_it_idles_the_carveout_and_off_it_leaves_it():
    on = speedups.resolve(_asked("tp", copy_engine_collectives="on"), cuda=True)
    assert on["on"]["copy_engine_collectives"] and not on["on"]["sms_for_collectives"]
    assert "copy engines" in on["sms_for_collectives_off_because"]
    off = speedups.resolve(_asked("tp", world=2, copy_engine_collectives="off"), cuda=True)
    assert not off["on"]["copy_engine_collectives"] and off["on"]["sms_for_collectives"]


def test_auto_takes_it_where_it_was_measured_faster():
    two = speedups.resolve(_asked("tp", world=2), cuda=True)
    assert two["on"]["copy_engine_collectives"] and not two["on"]["sms_for_collectives"]
    four = speedups.resolve(_asked("tp", world=4), cuda=True)
    assert not four["on"]["copy_engine_collectives"] and four["on"]["sms_for_collectives"]
    assert four["copy_engine_collectives_off_because"] == (
        "measured faster on two GPUs only, not yet on 4")
    assert speedups.resolve(_asked("tp", world=4, copy_engine_collectives="on"),
                            cuda=True)["on"]["copy_engine_collectives"]


def test_each_run_gets_the_collectives_of_its_own_choice():
    try:
        ce.swap_collectives(True, True, many_runs=True)
        assert tensor_parallel.COLLECTIVES == tensor_parallel.Collectives(
            peer_copies.gather, peer_copies.scatter_buffer, peer_copies.scatter)
        ce.swap_collectives(False, True, many_runs=True)
        assert tensor_parallel.COLLECTIVES == tensor_parallel.Collectives()
        ce.swap_collectives(True, False, many_runs=False)  # on a CPU: gloo's collectives
        assert tensor_parallel.COLLECTIVES == tensor_parallel.Collectives()
    finally:
        tensor_parallel.COLLECTIVES = tensor_parallel.Collectives()
