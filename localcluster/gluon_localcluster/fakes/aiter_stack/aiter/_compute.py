"""The fake kernels' arithmetic: split-KV MLA decode over work items, in torch ops of static shape.

Real aiter's persistent kernel reads its work list (work_info_set) and reduce maps from the metadata it
is given; so does this. Each work item names a batch, its q rows and a KV range (positions into
kv_indices); its partial softmax state is computed in 16-token tiles (aiter's smallest KV granularity,
so a split never cuts a tile), and partials are merged as the reduce maps say. Metadata built for
another batch therefore gives a wrong answer, as on the GPU.

Every op here keeps its shapes fixed by the buffers' sizes and never reads a device value on the host
(no .item(), .tolist(), nonzero or boolean indexing), so it runs inside CUDA graph capture and replays
with new lengths written into the same buffers. On a CPU it computes the same numbers.
"""

from __future__ import annotations

import torch

TILE = 16  # tokens per tile: aiter's minimum kv_granularity
TILES_PER_CHUNK = 2048  # bounds the temporaries (about 75 MB a tensor at 16 rows)
D_LATENT = 512


class Works:
    """Work items as tensors of shape [W]: batch, first q row, q rows, KV start and end (positions into
    kv_indices, end exclusive). An item with start >= end is empty."""

    def __init__(self, batch, qo_start, qo_len, kv_start, kv_end):
        self.batch, self.qo_start, self.qo_len, self.kv_start, self.kv_end = (
            t.long() for t in (batch, qo_start, qo_len, kv_start, kv_end))

    def __len__(self):
        return self.batch.numel()


def scale_value(kv_scale, device):
    """A Python float, or a one-element device tensor read on the device (never on the host)."""
    if isinstance(kv_scale, torch.Tensor):
        return kv_scale.reshape(-1)[:1].to(device=device, dtype=torch.float32)
    return float(kv_scale)


def merge(dst, group, m, l, acc):
    """Folds partial softmax states (m, l, acc: [P, R], [P, R], [P, R, 512]) into dst's groups
    (dst = (m, l, acc) of shape [G, ...]) by `group` [P] (out-of-range groups are dropped)."""
    dm, dl, dacc = dst
    groups = dm.shape[0]
    keep = (group >= 0) & (group < groups)
    group = group.clamp(0, groups - 1)
    m = torch.where(keep[:, None], m, torch.full_like(m, float("-inf")))
    new_m = dm.scatter_reduce(0, group[:, None].expand_as(m), m, reduce="amax", include_self=True)
    finite = torch.isfinite(new_m)
    safe_m = torch.where(finite, new_m, torch.zeros_like(new_m))
    old = torch.where(finite, torch.exp(dm - safe_m), torch.zeros_like(dm))
    mine = torch.exp(m - safe_m[group])
    mine = torch.where(torch.isfinite(m) & keep[:, None], mine, torch.zeros_like(mine))
    dl.mul_(old).index_add_(0, group, l * mine)
    dacc.mul_(old[..., None]).index_add_(0, group, acc * mine[..., None])
    dm.copy_(new_m)


def empty_state(groups, rows, device):
    return (torch.full((groups, rows), float("-inf"), device=device),
            torch.zeros(groups, rows, device=device),
            torch.zeros(groups, rows, D_LATENT, device=device))


def sequences(kv_indptr):
    """(start, length) per sequence, [B] each, from a [B+1] kv_indptr."""
    bounds = kv_indptr.long()
    return bounds[:-1], bounds[1:] - bounds[:-1]


def work_partials(q, kv, kv_indices, seqs, kv_scale, sm_scale, max_q, works: Works):
    """Each work item's softmax state over its KV range: (m, l, acc) of shape [W, max_q*H(, 512)],
    row r = position r // H of the item's q rows, head r % H. Causal within a q block: q row i of an
    item with n rows sees the first L - n + i + 1 tokens of its sequence; `seqs` is (start, length) of
    every sequence in kv_indices, [B] each."""
    device, heads = q.device, q.shape[1]
    rows = max_q * heads
    state = empty_state(len(works), rows, device)
    scale = scale_value(kv_scale, device)
    n_tiles = (works.kv_end - works.kv_start).clamp_min(0).add(TILE - 1).div(TILE, rounding_mode="floor")
    tile_end = n_tiles.cumsum(0)
    capacity = kv_indices.numel() // TILE + len(works) + 1  # static: every item's tiles fit
    offsets = torch.arange(TILE, device=device)
    row_pos = torch.arange(max_q, device=device).repeat_interleave(heads)  # [R] position in the q block
    row_head = torch.arange(heads, device=device).repeat(max_q)
    for first in range(0, capacity, TILES_PER_CHUNK):
        tile = torch.arange(first, min(first + TILES_PER_CHUNK, capacity), device=device)
        owner = torch.searchsorted(tile_end, tile, right=True).clamp_max(len(works) - 1)
        in_item = tile - (tile_end[owner] - n_tiles[owner])
        real = tile < tile_end[-1]
        pos = works.kv_start[owner, None] + in_item[:, None] * TILE + offsets  # [T, 16] into kv_indices
        batch = works.batch[owner]
        batch = batch.clamp(0, seqs[0].numel() - 1)
        seq_start, seq_len = seqs[0][batch], seqs[1][batch]
        n_q = works.qo_len[owner]
        # token j of the tile is seen by q row i when it is in the item and causal for i
        seen = (pos < works.kv_end[owner, None]) & real[:, None]
        limit = seq_len[:, None] - n_q[:, None] + row_pos[None, :]  # [T, R] last relative position seen
        visible = seen[:, None, :] & ((pos - seq_start[:, None])[:, None, :] <= limit[:, :, None])
        visible &= (row_pos[None, :] < n_q[:, None])[:, :, None]
        tokens = kv_indices[pos.clamp(0, kv_indices.numel() - 1)].long().clamp(0, kv.shape[0] - 1)
        keys = kv[tokens].float()  # [T, 16, 576]
        q_rows = (works.qo_start[owner, None] + row_pos[None, :]).clamp(0, q.shape[0] - 1)  # [T, R]
        queries = q[q_rows, row_head[None, :].expand_as(q_rows)].float()  # [T, R, 576]
        scores = torch.bmm(queries, keys.transpose(1, 2)) * (sm_scale * scale)  # [T, R, 16]
        scores = scores.masked_fill(~visible, float("-inf"))
        m = scores.amax(-1)
        safe_m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(scores - safe_m[..., None])
        acc = torch.bmm(p, keys[..., :D_LATENT]) * scale
        merge(state, torch.where(real, owner, torch.full_like(owner, -1)), m, p.sum(-1), acc)
    return state


def finish(state, out, heads, max_q, rows_of_group):
    """Writes normalized outputs: group g's row r goes to out[rows_of_group[g] + r // H, r % H].
    Rows no item covered stay as they were (a real kernel leaves them unwritten too)."""
    m, l, acc = state
    value = acc / l.clamp_min(1e-30)[..., None]
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
