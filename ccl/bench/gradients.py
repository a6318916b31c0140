"""Real gradients: compress a torch model's per-layer gradients with error feedback.

``python -m ccl.bench gradients`` trains a small MLP on scikit-learn's bundled
digits data set (no download) with SGD, and at every step compresses each
layer's gradient with each codec, keeping one error-feedback residual per
layer and codec (``p = g + e; c = encode(p); e = p - decode(c)``), as a worker
does. It reports the steady state (the second half of the steps): payload
bits per value, compression ratio against float32, the fraction of values a
sparsifier kept, and the relative error of the delivered gradient sum.

The gradients are generated in the run and only saved if ``--save`` asks;
nothing here is committed data. Needs ``torch`` and ``scikit-learn``.
"""

import argparse
import json

import numpy as np

DEFAULT_CODECS = [
    {"id": "3lc", "s": 1.0}, {"id": "3lc", "s": 1.5}, {"id": "3lc", "s": 1.75},
    {"id": "3lc", "s": 1.9},
    {"id": "sidco", "density": 0.01, "dist": "exp"},
    {"id": "sidco", "density": 0.01, "dist": "gpareto"},
    {"id": "sidco", "density": 0.01, "dist": "gamma"},
    {"id": "sidco", "density": 0.001, "dist": "exp"},
    {"id": "sidco", "density": 0.001, "dist": "gpareto"},
    {"id": "sidco", "density": 0.001, "dist": "gamma"},
    {"id": "sidco", "density": 0.01, "dist": "exp", "adaptive": True},
    {"id": "sidco", "density": 0.01, "dist": "gpareto", "adaptive": True},
    {"id": "sidco", "density": 0.01, "dist": "gamma", "adaptive": True},
    {"id": "sidco", "density": 0.001, "dist": "exp", "adaptive": True},
    {"id": "sidco", "density": 0.001, "dist": "gpareto", "adaptive": True},
    {"id": "sidco", "density": 0.001, "dist": "gamma", "adaptive": True},
    {"id": "dgc", "density": 0.01}, {"id": "topk", "density": 0.01},
]


def collect_gradients(steps=200, hidden=256, batch=64, lr=0.05, seed=0):
    """Train an MLP on digits; return a list (per step) of lists (per layer) of float32 grads."""
    import torch
    from sklearn.datasets import load_digits

    torch.manual_seed(seed)
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    grads = []
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        grads.append([p.grad.detach().numpy().astype(np.float32).ravel().copy()
                      for p in model.parameters()])
        opt.step()
    return grads


def measure(grads, specs):
    """Steady-state statistics of every codec on the gradient sequence."""
    from ccl.codecs import get_codec

    rows = []
    steps = len(grads)
    steady = range(steps // 2, steps)
    for spec in specs:
        codec = get_codec(spec)
        residuals = [np.zeros_like(g) for g in grads[0]]
        bits = values = kept = 0
        delivered = [np.zeros(g.size) for g in grads[0]]
        truth = [np.zeros(g.size) for g in grads[0]]
        for step, layers in enumerate(grads):
            for i, g in enumerate(layers):
                p = g + residuals[i]
                payload = codec.encode(p)
                decoded = codec.decode(payload)
                residuals[i] = p - decoded
                delivered[i] += decoded
                truth[i] += g
                if step in steady:
                    bits += 8 * payload.size
                    values += g.size
                    kept += int(np.count_nonzero(decoded))
        error = np.sqrt(sum(float(np.sum((d - t) ** 2)) for d, t in zip(delivered, truth)) /
                        sum(float(np.sum(t ** 2)) for t in truth))
        rows.append(dict(codec=codec.codec_id, config=codec.get_config(),
                         bits_per_value=bits / values, ratio=32 * values / bits,
                         kept_fraction=kept / values, running_error=error, steps=steps))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench gradients",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=None,
                        help="codec ids or JSON configs (default: 3lc at four s, sparsifiers)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save", help="also save the gradients to this .npz file")
    parser.add_argument("--json", help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    specs = ([json.loads(s) if s.startswith("{") else s for s in args.codecs]
             if args.codecs else DEFAULT_CODECS)
    grads = collect_gradients(args.steps)
    if args.save:
        np.savez_compressed(args.save, **{f"step{t}_layer{i}": g
                                          for t, layers in enumerate(grads)
                                          for i, g in enumerate(layers)})
    rows = measure(grads, specs)
    sizes = [g.size for g in grads[0]]
    print(f"{'codec':>8} {'bits/value':>10} {'ratio':>8} {'kept':>8} {'run.err':>8}  config")
    for r in rows:
        print(f"{r['codec']:>8} {r['bits_per_value']:10.3f} {r['ratio']:7.1f}x "
              f"{r['kept_fraction']:8.4f} {r['running_error']:8.2e}  {json.dumps(r['config'])}")
    print(f"(MLP on sklearn digits, layers {sizes}, {args.steps} SGD steps; steady state = "
          "second half; per-layer error feedback; kept = nonzero decoded fraction; run.err = "
          "relative error of the summed delivered gradients)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
