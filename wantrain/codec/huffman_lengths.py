"""Code lengths limited to MAX_CODE_LEN bits, compiled with numba (package-merge).

huffman_codes.py calls it when a chunk is encoded, and imports this module only then: numba is
loaded only where something is encoded. Its own module so that it needs nothing of the Huffman
format, and the format's constants (huffman_codes.py) need nothing of it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["package_merge"]


@njit(nogil=True, cache=True)
def package_merge(leaf_w: np.ndarray, max_len: int) -> np.ndarray:
    """Code length of each of n symbols, given their weights in ascending order (n >= 2).

    List 1 holds the symbols by weight; list k+1 merges the symbols with the packages (adjacent
    pairs) of list k, symbols first among equal weights. The 2n - 2 lightest items of the last
    list are the selection; a symbol's code length is how many selected items contain it. Every
    list is sorted and packages take the lightest items first, so each selection is a prefix: of
    the first m items of a list, the c leaves are the c lightest symbols (one more bit each) and
    the m - c packages select the first 2 (m - c) items of the list below. Compiled: the encoder
    runs it for every table of every chunk, and as numpy calls it cost a tenth of the encode."""
    n = leaf_w.size
    is_leaf = np.zeros((max_len, 2 * n), np.bool_)          # (list, item): a symbol, not a package
    sizes = np.zeros(max_len, np.int64)
    is_leaf[0, :n] = True
    sizes[0] = n
    weights = leaf_w.copy()
    for level in range(1, max_len):
        k = weights.size // 2
        merged = np.empty(n + k, np.int64)
        i = j = 0
        for o in range(n + k):
            if j >= k or (i < n and leaf_w[i] <= weights[2 * j] + weights[2 * j + 1]):
                merged[o] = leaf_w[i]
                is_leaf[level, o] = True
                i += 1
            else:
                merged[o] = weights[2 * j] + weights[2 * j + 1]
                j += 1
        weights = merged
        sizes[level] = n + k
    depth = np.zeros(n, np.int64)
    m = 2 * n - 2
    for level in range(max_len - 1, -1, -1):
        c = 0
        for o in range(min(m, sizes[level])):
            c += is_leaf[level, o]
        depth[:c] += 1
        m = 2 * (m - c)
    return depth
