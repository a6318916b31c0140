"""Horovod's synthetic benchmark, unchanged but for its import, on ccl.torch.

In the shape of Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py``
(with a model built here instead of torchvision's, and CPU only)::

    python -m ccl.run -np 4 python -m mpi4py examples/horovod_synthetic.py
    python -m ccl.run -np 4 python -m mpi4py examples/horovod_synthetic.py --fp16-allreduce

Rank 0 prints the throughput of every iteration and the total.
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F

# import horovod.torch as hvd   <- the one line that changes
import ccl.torch as hvd


def model_of(name):
    """A model for 3x32x32 images and 1000 classes (torchvision is not needed)."""
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 512),
                                   torch.nn.ReLU(), torch.nn.Linear(512, 1000))
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(4), torch.nn.Flatten(),
                               torch.nn.Linear(16 * 8 * 8, 1000))


def main():
    parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", type=str, default="cnn", choices=("cnn", "mlp"),
                        help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=2,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=3,
                        help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=3,
                        help="number of benchmark iterations")
    parser.add_argument("--use-adasum", action="store_true", default=False,
                        help="use adasum algorithm to do reduction")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)
    model = model_of(args.model)

    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Set up fixed fake data
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.LongTensor(args.batch_size).random_() % 1000

    def benchmark_step():
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()

    def log(s, nl=True):
        if hvd.rank() != 0:
            return
        print(s, end="\n" if nl else "", flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {hvd.size()}")

    # Warm-up
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    # Benchmark
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log(f"Iter #{x}: {img_sec:.1f} img/sec per CPU")
        img_secs.append(img_sec)

    # Results
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per CPU: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")

    # ccl: the ranks' weights are still identical (averaged gradients, same steps)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    spread = hvd.allreduce(weights, op=hvd.Max, name="check.max") - \
        hvd.allreduce(weights, op=hvd.Min, name="check.min")
    log(f"Largest weight difference between ranks: {spread.abs().max().item():.3g}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
