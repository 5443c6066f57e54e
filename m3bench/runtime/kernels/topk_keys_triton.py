"""Packed top-k keys: one int64 per candidate whose integer order is the selection's order.

The high half is the fp32 score's bits made order-preserving as a signed integer, the low half
NO_INDEX - index, so among equal scores the lower index is the larger key. One integer max over
the keys is then the best candidate, score and index together: a top-k round needs one reduction
where a float max followed by a min of the index at that max needed two.

    key = ordered_key(score, index, valid)   # int64; NO_KEY where not valid or NaN
    best = tl.max(tl.where(key < prev, key, NO_KEY), axis=...)
    index = key_index(best)                   # -1 for NO_KEY
"""

import triton
import triton.language as tl

NO_INDEX = tl.constexpr(2147483647)
NO_KEY = tl.constexpr(-9223372036854775808)  # below every real key (its high half would be a NaN's)
MAX_KEY = tl.constexpr(9223372036854775807)  # above every real key: the bound before the first round


@triton.jit
def ordered_key(v, idx, valid):
    """The key of score v (fp32) at index idx (int32, >= 0); NO_KEY where not valid or v is NaN.
    -0.0 keys as +0.0, which it equals (a tie broken by the index, as the float compare does)."""
    bits = tl.where(v == 0.0, 0.0, v).to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits
    key = (ordered.to(tl.int64) << 32) | (-idx.to(tl.int64) + NO_INDEX)  # constexpr - tensor breaks the interpreter
    return tl.where(valid & (v == v), key, NO_KEY)


@triton.jit
def key_index(key):
    """The index of a key; -1 for NO_KEY (no candidate was left)."""
    return tl.where(key == NO_KEY, -1, (-(key & 0x7FFFFFFF) + NO_INDEX).to(tl.int32))  # low half < 2^31
