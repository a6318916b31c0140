"""Data-parallel training of a small MLP on scikit-learn's digits with ccl.torch.

Run (any number of ranks; the data set is bundled with scikit-learn)::

    mpiexec -n 4 python -m mpi4py examples/train_digits.py --codec fp16 --plot digits.png

``--codec`` takes any registered codec id (``python -c "import ccl;
print(ccl.codecs.registered_codecs())"``) or a JSON config such as
'{"id": "fp16"}'. Each rank trains on its own shard of the training set;
rank 0 prints the loss and test accuracy per epoch and writes the plot.
"""

import argparse
import json
import os
import sys
import time

import torch

import ccl
import ccl.torch as ct
# the data shards and model are shared with the benchmark (python -m ccl.bench.torch_digits)
from ccl.bench.torch_digits import accuracy, digits_shards, mlp


def parse_codec(text):
    """A codec from an id or a JSON config; exit with the known ids if it is unknown."""
    try:
        return ccl.codecs.get_codec(json.loads(text) if text.lstrip().startswith("{") else text)
    except (ValueError, TypeError) as exc:  # every rank fails alike: nothing has started
        sys.exit(f"train_digits.py: --codec {text}: {exc}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", default="none", help="codec id or JSON config")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--plot", help="write the convergence plot (PNG) here")
    args = parser.parse_args()
    codec = parse_codec(args.codec)

    ct.init()
    # ranks on one node share its cores
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ct.local_size()))
    x_train, y_train, x_test, y_test = digits_shards(ct.rank(), ct.size())

    model = mlp(args.hidden, seed=ct.rank())  # different on purpose: the broadcast aligns them
    ct.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    optimizer = ct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        codec=codec)

    history = []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train))  # every rank: same number of steps
        losses = []
        for first in range(0, len(order) - args.batch + 1, args.batch):
            batch = order[first:first + args.batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()  # buckets of gradients are reduced while this runs
            optimizer.step()  # waits for them, then updates with the average
            losses.append(loss.item())
        mean_loss = sum(ct.allgather_object(sum(losses) / len(losses))) / ct.size()
        if ct.rank() == 0:
            history.append((mean_loss, accuracy(model, x_test, y_test)))
            print(f"epoch {epoch + 1:3d}  loss {mean_loss:.4f}  test accuracy "
                  f"{history[-1][1]:.4f}", flush=True)
    if ct.rank() == 0:
        print(f"codec {codec.get_config()}, {ct.size()} ranks, "
              f"{time.perf_counter() - start:.1f} s")
        if args.plot:
            plot(history, args.plot, f"digits MLP, codec {codec.codec_id}, {ct.size()} ranks")
    ct.shutdown()


def plot(history, path, title):
    """Loss and test accuracy per epoch, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = range(1, len(history) + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(epochs, [h[0] for h in history])
    left.set(xlabel="epoch", ylabel="training loss (mean over ranks)", yscale="log")
    right.plot(epochs, [h[1] for h in history])
    right.set(xlabel="epoch", ylabel="test accuracy")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
