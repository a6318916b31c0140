"""``hvd.elastic`` is not available in ``ccl.torch``: every name raises ``NotImplementedError``.

Elastic training (ranks joining and leaving a running job) needs a
rendezvous service and a controller that MPI jobs do not have. Restart the
job from a checkpoint instead (see the reliability guide).
"""

__all__ = ["HostsUpdatedInterrupt"]

_MESSAGE = ("hvd.elastic ({name}) is not supported by ccl.torch: elastic training needs "
            "Horovod's rendezvous and Gloo controller; run a fixed-size MPI job and restart "
            "it from a checkpoint instead")


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal that elastic hosts changed; ``ccl.torch`` never raises it.

    Exported so that Horovod programs which catch it import unchanged.

    Parameters
    ----------
    skip_sync : bool
        Horovod's flag: whether the state sync after the update is skipped.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> issubclass(hvd.HostsUpdatedInterrupt, RuntimeError)
    True
    """

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(_MESSAGE.format(name=f"hvd.elastic.{name}"))
