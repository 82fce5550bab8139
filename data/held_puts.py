"""A loader's iterator started with Ctrl-C and SIGTERM held, and each of its index puts: an
interrupt inside a queue's put could leave its lock taken, and the loader's shutdown
then waited on it for ever. The design in full: docs/design.md, this module's section."""

from core.signals import stop_signals_held


def held_iter(loader):
    """iter(loader) with Ctrl-C and SIGTERM held while PyTorch's loader forks its workers
    (a KeyboardInterrupt amid the forks left a half-made iterator; they start with both
    blocked: core/signals.stop_signals_held), then its index puts held (the module's why)."""
    with stop_signals_held(forks=True):
        batches = iter(loader)
    for queue in getattr(batches, "_index_queues", ()):  # none without workers
        queue.put = _held(queue.put)
    return batches


def _held(put):
    def held_put(*args, **kwargs):
        with stop_signals_held():
            return put(*args, **kwargs)
    return held_put
