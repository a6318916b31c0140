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


MODELS = ("mlp", "cnn", "lm")


def _digits():
    import torch
    from sklearn.datasets import load_digits

    data = load_digits()
    return (torch.tensor(data.data / 16.0, dtype=torch.float32),
            torch.tensor(data.target, dtype=torch.long))


def _text_tokens(vocab=2000):
    """Word ids of the docstrings of Python's standard library (bundled, so no download)."""
    import collections
    import pydoc
    import re

    words = []
    for name in ("argparse", "collections", "email.message", "json", "logging", "pathlib",
                 "random", "string", "textwrap", "threading", "typing", "unittest"):
        module = pydoc.locate(name)
        for obj in [module] + [getattr(module, a, None) for a in sorted(dir(module))]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str):
                words += re.findall(r"[a-z]+|[.,;:()]", doc.lower())
    common = [w for w, _ in collections.Counter(words).most_common(vocab - 1)]
    ids = {w: i + 1 for i, w in enumerate(common)}  # 0: every rarer word
    return [ids.get(w, 0) for w in words], vocab


def _model(kind, hidden):
    """``(model, batch function)`` of one kind: digits MLP or CNN, or a word-level LM."""
    import torch

    nn = torch.nn
    if kind == "lm":
        tokens, vocab = _text_tokens()
        tokens = torch.tensor(tokens, dtype=torch.long)

        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(vocab, 64)
                self.rnn = nn.GRU(64, hidden, batch_first=True)
                self.out = nn.Linear(hidden, vocab)

            def forward(self, ids):
                return self.out(self.rnn(self.embed(ids))[0]).reshape(-1, vocab)

        def batch(gen, size, length=32):
            start = torch.randint(0, tokens.numel() - length - 1, (size // 4,), generator=gen)
            rows = torch.stack([tokens[s:s + length + 1] for s in start.tolist()])
            return rows[:, :-1], rows[:, 1:].reshape(-1)
        return LM(), batch
    x, y = _digits()
    if kind == "cnn":
        x = x.reshape(-1, 1, 8, 8)
        model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(32 * 16, 10))
    elif kind == "mlp":
        model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                              nn.ReLU(), nn.Linear(hidden, 10))
    else:
        raise ValueError(f"model must be one of {MODELS}, got {kind!r}")

    def batch(gen, size):
        idx = torch.randint(0, x.shape[0], (size,), generator=gen)
        return x[idx], y[idx]
    return model, batch


def collect_gradients(steps=200, hidden=256, batch=64, lr=0.05, seed=0, model="mlp"):
    """Train a model with SGD; return a list (per step) of lists (per layer) of float32 grads.

    ``model``: ``"mlp"`` (digits, three linear layers), ``"cnn"`` (digits, two
    convolutions and a linear layer) or ``"lm"`` (a word-level GRU language
    model with an embedding on the standard library's docstrings).
    """
    import torch

    torch.manual_seed(seed)
    net, next_batch = _model(model, hidden)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    grads = []
    for _ in range(steps):
        inputs, target = next_batch(gen, batch)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(inputs), target).backward()
        grads.append([p.grad.detach().numpy().astype(np.float32).ravel().copy()
                      for p in net.parameters()])
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
