"""The fake kernels' arithmetic: split-KV MLA decode over work items, in torch ops of static shape.

Real aiter's persistent kernel reads its work list (work_info_set) and reduce maps from the metadata it
is given; so does this. Each work item names a batch, its q rows and a KV range (positions into
kv_indices); its partial softmax state is computed in tiles cut from that range (the last one masked at
the item's end), and partials are merged as the reduce maps say. Metadata built for
another batch therefore gives a wrong answer, as on the GPU.

Every op here keeps its shapes fixed by the buffers' sizes and never reads a device value on the host
(no .item(), .tolist(), nonzero or boolean indexing), so it runs inside CUDA graph capture and replays
with new lengths written into the same buffers. On a CPU it computes the same numbers.
"""

from __future__ import annotations

import torch

TILE = 64  # tokens per tile; tiles are cut per work item and masked at its end, so any size is exact
TOKENS_PER_CHUNK = 65536  # tiles per loop step = this / TILE: bounds the temporaries (~150 MB of fp32 keys)
D_LATENT = 512
# plain numbers: the probe imports this module against a stand-in torch without finfo/iinfo
NOTHING = -(2**63)  # int64's lowest: a last position no token is at or before
LOWEST = -3.4028234663852886e38  # float32's lowest: a finite stand-in for -inf where a max is subtracted


class Works:
    """Work items as tensors of shape [W]: batch, first q row, q rows, KV start and end (positions into
    kv_indices, end exclusive). An item with start >= end is empty."""

    def __init__(self, batch, qo_start, qo_len, kv_start, kv_end):
        self.batch, self.qo_start, self.qo_len, self.kv_start, self.kv_end = (
            t.long() for t in (batch, qo_start, qo_len, kv_start, kv_end)
        )

    def __len__(self):
        return self.batch.numel()


def scale_value(kv_scale, device):
    """A Python float, or a one-element device tensor read on the device (never on the host)."""
    if isinstance(kv_scale, torch.Tensor):
        return kv_scale.reshape(-1)[:1].to(device=device, dtype=torch.float32)
    return float(kv_scale)


def merge(dst, group, m, sums, acc, keep=None):
    """Folds partial softmax states (m, sums, acc: [P, R], [P, R], [P, R, 512]) into dst's groups
    (dst = (m, sums, acc) of shape [G, ...]) by `group` [P]; where `keep` [P] is given, the other
    partials are dropped (their group may be out of range)."""
    dm, dl, dacc = dst
    if keep is not None:
        m = torch.where(keep[:, None], m, float("-inf"))
        group = torch.where(keep, group, 0).clamp(0, dm.shape[0] - 1)
    new_m = dm.scatter_reduce(0, group[:, None].expand_as(m), m, reduce="amax", include_self=True)
    safe_m = new_m.clamp_min(LOWEST)  # exp(-inf - LOWEST) = 0: an empty state or partial adds nothing
    old = (dm - safe_m).exp_()
    mine = (m - safe_m[group]).exp_()
    dl.mul_(old).index_add_(0, group, sums.mul_(mine))
    dacc.mul_(old[..., None]).index_add_(0, group, acc.mul_(mine[..., None]))
    dm.copy_(new_m)


def empty_state(groups, rows, device):
    return (
        torch.full((groups, rows), float("-inf"), device=device),
        torch.zeros(groups, rows, device=device),
        torch.zeros(groups, rows, D_LATENT, device=device),
    )


def sequences(kv_indptr):
    """(start, length) per sequence, [B] each, from a [B+1] kv_indptr."""
    bounds = kv_indptr.long()
    return bounds[:-1], bounds[1:] - bounds[:-1]


def work_partials(q, kv, kv_indices, seqs, kv_scale, sm_scale, max_q, works: Works):
    """Each work item's softmax state over its KV range: (m, sums, acc) of shape [W, max_q*H(, 512)],
    row r = position r // H of the item's q rows, head r % H. Causal within a q block: q row i of an
    item with n rows sees the first L - n + i + 1 tokens of its sequence; `seqs` is (start, length) of
    every sequence in kv_indices, [B] each.

    Per item, before the tile loop: its scaled query rows, the kv_indices position of its tile 0, and
    per row the last position it sees (its KV end, causality and its q rows folded in), so that each
    loop step gathers three per-item tables by tile owner and launches few kernels."""
    device, heads = q.device, q.shape[1]
    rows, count = max_q * heads, len(works)
    state = empty_state(count, rows, device)
    scale = scale_value(kv_scale, device)
    n_tiles = (works.kv_end - works.kv_start).clamp_min(0).add(TILE - 1).div(TILE, rounding_mode="floor")
    tile_end = n_tiles.cumsum(0)
    row_pos = torch.arange(max_q, device=device).repeat_interleave(heads)  # [R] position in the q block
    row_head = torch.arange(heads, device=device).repeat(max_q)
    batch = works.batch.clamp(0, seqs[0].numel() - 1)
    seq_start, seq_len = seqs[0][batch], seqs[1][batch]
    q_rows = (works.qo_start[:, None] + row_pos).clamp(0, q.shape[0] - 1)  # [W, R]
    queries = q[q_rows, row_head.expand_as(q_rows)].float().mul_(sm_scale * scale)  # [W, R, 576]
    # the last kv_indices position row r sees: causal for its q position, inside the item; none for the
    # rows past the item's q rows
    causal = (seq_start + seq_len - works.qo_len)[:, None] + row_pos
    last = torch.minimum(causal, works.kv_end[:, None] - 1)
    last = torch.where(row_pos < works.qo_len[:, None], last, NOTHING)
    # column 0: the kv_indices position of the item's tile 0 (tile t covers base + t * TILE onwards)
    table = torch.cat([(works.kv_start - (tile_end - n_tiles) * TILE)[:, None], last], dim=1)  # [W, 1 + R]
    per_chunk = max(1, TOKENS_PER_CHUNK // TILE)
    capacity = kv_indices.numel() // TILE + count + 1  # static: every item's tiles fit
    grid = torch.arange(per_chunk * TILE, device=device).view(per_chunk, TILE)  # token offsets of a step
    for first in range(0, capacity, per_chunk):
        tiles = min(per_chunk, capacity - first)
        # tiles past the last item's belong to it, past its end: nothing in them is seen
        owner = torch.searchsorted(
            tile_end, grid[:tiles, 0].div(TILE, rounding_mode="floor").add_(first), right=True
        ).clamp_max_(count - 1)
        mine = table[owner]
        pos = grid[:tiles].add(mine[:, :1]).add_(first * TILE)  # [T, TILE] positions into kv_indices
        tokens = kv_indices[pos.clamp(0, kv_indices.numel() - 1)].clamp_(0, kv.shape[0] - 1)
        keys = kv[tokens].float()  # [T, TILE, 576]
        scores = torch.bmm(queries[owner], keys.transpose(1, 2))  # [T, R, TILE]
        scores.masked_fill_(pos[:, None, :] > mine[:, 1:, None], float("-inf"))
        m = scores.amax(-1)
        p = scores.sub_(m.clamp_min(LOWEST)[..., None]).exp_()
        merge(state, owner, m, p.sum(-1), torch.bmm(p, keys[..., :D_LATENT]))
    state[2].mul_(scale)  # V is the scaled KV: one factor on every partial
    return state


def finish(state, out, heads, max_q, rows_of_group):
    """Writes normalized outputs: group g's row r goes to out[rows_of_group[g] + r // H, r % H].
    Rows no item covered stay as they were (a real kernel leaves them unwritten too)."""
    m, sums, acc = state
    value = acc / sums.clamp_min(1e-30)[..., None]
    written = torch.isfinite(m)
    q_row = rows_of_group.long()[:, None] + torch.arange(max_q, device=out.device).repeat_interleave(heads)[None, :]
    head = torch.arange(heads, device=out.device).repeat(max_q)[None, :].expand_as(q_row)
    q_row = torch.where(written, q_row.clamp(0, out.shape[0] - 1), torch.full_like(q_row, out.shape[0]))
    flat = out.view(-1, out.shape[-1])
    padded = torch.cat([flat, flat.new_zeros(heads, flat.shape[-1])])  # row out.shape[0] swallows the unwritten
    index = (q_row * heads + head).reshape(-1)
    index = torch.where(index < flat.shape[0], index, torch.full_like(index, flat.shape[0]))
    padded.index_copy_(0, index, value.reshape(-1, value.shape[-1]).to(out.dtype))
    flat.copy_(padded[: flat.shape[0]])
