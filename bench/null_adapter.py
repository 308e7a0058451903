"""A benchmark adapter: kernel 'null' returns zeros (O and LSE) without computing: a pure protocol round trip."""

import numpy as np

from attnfuzz.adapter import Kernel, serve


def null(q, k, v, p):
    return (np.zeros((p.batch, p.seq_q, p.heads_q, p.head_dim_v), np.float32),
            np.zeros((p.batch, p.heads_q, p.seq_q), np.float32))


if __name__ == "__main__":
    serve([Kernel("null", null, lse=True)], name="null")
