"""``hvd.elastic`` is not available in ``ccl.torch``: every name raises ``NotImplementedError``.

Elastic training (ranks joining and leaving a running job) needs a
rendezvous service and a controller that MPI jobs do not have. Restart the
job from a checkpoint instead (see the reliability guide).
"""

__all__ = []

_MESSAGE = ("hvd.elastic ({name}) is not supported by ccl.torch: elastic training needs "
            "Horovod's rendezvous and Gloo controller; run a fixed-size MPI job and restart "
            "it from a checkpoint instead")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(_MESSAGE.format(name=f"hvd.elastic.{name}"))
