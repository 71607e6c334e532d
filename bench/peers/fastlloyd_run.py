"""Run the public FastLloyd implementation (Diaa et al., USENIX Security 2025; github.com/
D-Diaa/FastLloyd) on one data array: called by ``bench/fastlloyd.py`` as a subprocess,
with the Python of an environment where FastLloyd's own dependencies are installed.
Nothing of FastLloyd is copied or re-implemented here: its ``Params``, ``local_proto``
(the single-process simulation of its accuracy experiments), ``to_fixed``/``unscale`` are
imported from the checkout given and called as its ``experiments.py`` calls them, with the
variant its paper calls FastLloyd (Gaussian noise, radius constraint
``diagonal_then_frac`` with alpha 0.8, centers folded into [-1, 1], masked protocol).

    PYTHON fastlloyd_run.py --fastlloyd CHECKOUT --data X.npy --assign ids.npy --k K \
        --epsilon E --seed S --out centers.npy

``X.npy``: the points, already scaled to [-1, 1] (FastLloyd's bounds); ``ids.npy``: each
row's client (0 .. clients-1). FastLloyd fixes delta = 1/(n ln n) and its number of
iterations itself. Prints one JSON line: iterations and seconds.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


def import_fastlloyd(path):
    """FastLloyd's modules; its configs.defaults module lists ./data at import, so the import
    runs from a scratch folder holding an empty data/."""
    sys.path.insert(0, os.path.abspath(path))
    previous = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        os.mkdir(os.path.join(scratch, "data"))
        os.chdir(scratch)
        try:
            from configs import Params
            from data_io import to_fixed, unscale
            from utils.protocols import local_proto
        finally:
            os.chdir(previous)
    return Params, to_fixed, unscale, local_proto


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fastlloyd", required=True, help="the FastLloyd checkout")
    parser.add_argument("--data", required=True, help=".npy (n, d) points in [-1, 1]")
    parser.add_argument("--assign", required=True, help=".npy: the client (0 .. clients-1) of every row")
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument(
        "--seed", type=int, required=True, help=">= 1 (FastLloyd seeds its noise with seed x iteration)"
    )
    parser.add_argument("--out", required=True, help="where the centers (.npy) go")
    args = parser.parse_args()
    Params, to_fixed, unscale, local_proto = import_fastlloyd(args.fastlloyd)
    X = np.load(args.data).astype(np.float64)
    ids = np.load(args.assign).astype(int).ravel()
    if X.ndim != 2 or ids.shape[0] != X.shape[0]:
        sys.exit(f"data {X.shape} and assignment {ids.shape} do not match")
    if X.min() < -1 - 1e-9 or X.max() > 1 + 1e-9:
        sys.exit("the data must lie in [-1, 1]: FastLloyd's privacy bounds assume it")
    n, d = X.shape
    clients = int(ids.max()) + 1
    params = Params(
        num_clients=clients,
        k=args.k,
        dim=d,
        data_size=n,
        dp="gaussiananalytic",
        eps=args.epsilon,
        method="diagonal_then_frac",
        post="fold",
        delay=0,
    )
    params.alpha = 0.8
    params.calculate_iters()
    params.seed = args.seed
    values = to_fixed(X.copy())  # FastLloyd always computes in 16-bit fixed point
    started = time.perf_counter()
    centers, _ = local_proto([values[ids == c] for c in range(clients)], params, method="masked")
    seconds = time.perf_counter() - started
    np.save(args.out, unscale(np.asarray(centers)).astype(np.float64))
    print(json.dumps({"iterations": int(params.iters), "seconds": seconds, "delta": 1.0 / (n * np.log(n))}))


if __name__ == "__main__":
    main()
