"""Every public name of Horovod's ``horovod.torch`` exists in ``ccl.torch``.

The lists are Horovod's (``horovod/torch/__init__.py`` imports them from
``mpi_ops.py``, ``functions.py``, ``optimizer.py``, ``sync_batch_norm.py`` and
``compression.py``), so a program written for Horovod finds every name it
can use. Elastic training is out of scope: ``hvd.elastic``'s names raise
``NotImplementedError`` with a message saying what to do instead.
"""

import inspect

import pytest

pytest.importorskip("torch")

import ccl.torch as hvd  # noqa: E402
from ccl.torch import compression  # noqa: E402

# horovod/torch/__init__.py, by the module Horovod imports them from
MPI_OPS = """
allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async
grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async
grouped_allgather grouped_allgather_async broadcast broadcast_async broadcast_ broadcast_async_
alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized
start_timeline stop_timeline size local_size cross_size rank local_rank cross_rank
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built
ccl_built cuda_built rocm_built ProcessSet global_process_set add_process_set remove_process_set
Average Sum Adasum Min Max Product HorovodInternalError
""".split()
FUNCTIONS = ["allgather_object", "broadcast_object", "broadcast_optimizer_state",
             "broadcast_parameters"]
OTHERS = ["elastic", "Compression", "DistributedOptimizer", "SyncBatchNorm"]
COMPRESSION = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]
ELASTIC = ["run", "State", "ObjectState", "TorchState", "ElasticSampler"]

# Horovod's leading parameters (names and order), which programs pass by position or name
SIGNATURES = {
    "allreduce": ["tensor", "average", "name", "compression", "op", "prescale_factor",
                  "postscale_factor", "process_set"],
    "allreduce_async": ["tensor", "average", "name", "op", "prescale_factor",
                        "postscale_factor", "process_set"],
    "allgather": ["tensor", "name", "process_set"],
    "broadcast": ["tensor", "root_rank", "name", "process_set"],
    "alltoall": ["tensor", "splits", "name", "process_set"],
    "reducescatter": ["tensor", "name", "compression", "op", "process_set"],
    "broadcast_object": ["obj", "root_rank", "name", "process_set"],
    "DistributedOptimizer": ["optimizer", "named_parameters", "compression",
                             "backward_passes_per_step", "op", "gradient_predivide_factor",
                             "num_groups", "groups", "sparse_as_dense", "process_set"],
}


@pytest.mark.parametrize("name", MPI_OPS + FUNCTIONS + OTHERS)
def test_every_horovod_torch_name_exists(name):
    assert hasattr(hvd, name), f"ccl.torch lacks horovod.torch.{name}"
    assert name in hvd.__all__


@pytest.mark.parametrize("name", COMPRESSION)
def test_compression_names(name):
    assert hasattr(compression, name)


def test_compressors_follow_horovods_interface():
    for compressor in (hvd.Compression.none, hvd.Compression.fp16):
        assert issubclass(compressor, compression.Compressor)
        assert callable(compressor.compress) and callable(compressor.decompress)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_horovods_parameters_lead(name):
    parameters = list(inspect.signature(getattr(hvd, name)).parameters)
    assert parameters[:len(SIGNATURES[name])] == SIGNATURES[name]


@pytest.mark.parametrize("name", ELASTIC)
def test_elastic_names_raise_not_implemented(name):
    with pytest.raises(NotImplementedError, match=f"hvd.elastic.{name}.*not supported"):
        getattr(hvd.elastic, name)
