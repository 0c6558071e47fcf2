"""Attention that costs what its mask allows: zoo's structured masks (zoo.kernels.Mask) computed by
the backend zoo picks (the blocked kernel on CPU, FlexAttention on CUDA) against the same mask
made dense for SDPA, and packed training against padded.

* ``window``: one attention layer (8 heads of 64, d_model 512) at T = 4,096 with a causal sliding
  window of 256, forward + backward: ``zoo`` (auto: blocked / flex) vs ``dense mask`` (SDPA on the
  [T, T] mask, what every layer with a window cost before); and the same with ALiBi's bias.
* ``packing``: a decoder training step (llama-small-like, 4 layers of 512) on the same documents,
  packed into rows of 1,024 with document masks vs one document a row padded to the longest;
  throughput counts the documents' own tokens (useful tokens/s).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import zoo
from bench.common import Row, Side, compare, here
from bench.workloads import _train_step, _zoo_opt
from zoo import kernels
from zoo.components.attention import Attention
from zoo.components.position import AlibiPosition
from zoo.kernels import Mask

Timing = dict


def window(precision: str, timing: Timing, tiny: bool = False, alibi: bool = False) -> Row:
    T, W, D, H = (256, 32, 64, 4) if tiny else (4096, 256, 512, 8)
    B = 8 if here().type == "cuda" and not tiny else 1  # a GPU needs more than one row to be busy
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    layer = Attention(D, n_heads=H, n_kv_heads=H, head_dim=D // H, v_head_dim=D // H, bias=False).to(dtype)
    x = torch.randn(B, T, D, dtype=dtype, requires_grad=True)
    bias = None
    if alibi:  # ALiBi's bias as zoo's alibi position gives it: slopes and positions (the dense side makes the tensor)
        bias = AlibiPosition().bias(H, torch.arange(T, device=here()), torch.arange(T, device=here()))
    mask = Mask(T, T, causal=True, window=W, bias=bias, device=here())

    def step(backend: str):
        def run() -> None:
            with kernels.attention_backend(backend):
                layer(x, mask=mask).sum().backward()
        return run

    picked = kernels.backend_for(mask, torch.empty(B, H, T, D // H, dtype=dtype))
    row = Row(workload=f"causal window {W}{' with ALiBi' if alibi else ''} at T={T}, attention fwd+bwd ({picked})",
              precision=precision,
              unit="tokens", work=B * T)
    row.seconds, row.spread = compare([Side("zoo", step("auto")), Side("dense mask", step("dense"))], **timing)
    row.extra["backend"] = picked
    return row


def documents(n: int, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    """``n`` documents with lengths like short web texts: geometric, mean ~120 tokens, 8..1024."""
    g = torch.Generator().manual_seed(seed)
    lengths = (torch.empty(n, device="cpu").exponential_(1 / 120, generator=g) + 8).clamp(max=1024).long()
    return [torch.randint(0, vocab, (int(k),), generator=g, device="cpu") for k in lengths]


def packing(precision: str, timing: Timing, tiny: bool = False) -> Row:
    L, n_docs = (128, 12) if tiny else (1024, 40)
    size = ["d_model=64", "n_layers=2", "block.attention.n_heads=4", "block.attention.n_kv_heads=2"] if tiny else [
        "d_model=512", "n_layers=4", "block.attention.n_heads=8", "block.attention.n_kv_heads=4",
        "block.ffn.hidden=1408"]
    spec = zoo.load_spec("llama-small", [*size, f"max_seq_len={L}", "vocab_size=32000"])
    model = zoo.build(spec, seed=0).train().to(here())
    docs = documents(n_docs, spec.vocab_size)
    if tiny:
        docs = [d[: L // 2] for d in docs]
    # packed: documents one after another into rows of L (a document that does not fit starts the next row)
    rows, ids, row, rid, k = [], [], [], [], 0
    for d in docs:
        d = d[:L]
        if len(row) + len(d) > L:
            rows.append(row + [0] * (L - len(row)))
            ids.append(rid + [k + 1] * (L - len(rid)))
            row, rid, k = [], [], k + 2
        row, rid, k = row + d.tolist(), rid + [k] * len(d), k + 1
    rows.append(row + [0] * (L - len(row)))
    ids.append(rid + [k + 1] * (L - len(rid)))
    packed, packed_ids = torch.tensor(rows, device=here()), torch.tensor(ids, device=here())
    useful = sum(len(d[:L]) for d in docs)
    longest = max(len(d[:L]) for d in docs)
    padded = torch.zeros(len(docs), longest, dtype=torch.long, device="cpu")
    pad_mask = torch.zeros(len(docs), longest, dtype=torch.bool, device="cpu")
    for i, d in enumerate(docs):
        padded[i, : len(d[:L])], pad_mask[i, : len(d[:L])] = d[:L], True
    padded, pad_mask = padded.to(here()), pad_mask.to(here())

    def packed_loss():
        logits = model(packed, documents=packed_ids)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), packed[:, 1:].flatten())

    def padded_loss():
        logits = model(padded, pad_mask)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), padded[:, 1:].flatten(), reduction="none",
                               ).mul(pad_mask[:, 1:].flatten()).sum() / pad_mask[:, 1:].sum()

    opt = _zoo_opt(model)
    row = Row(workload=f"{spec.n_layers}L/{spec.d_model} decoder train, {len(docs)} documents: packed rows of {L} "
              f"with document masks vs padded", precision=precision, unit="useful tokens", work=useful)
    row.seconds, row.spread = compare([Side("zoo", _train_step(model, packed_loss, opt, precision)),
                                       Side("padded", _train_step(model, padded_loss, opt, precision))], **timing)
    row.extra.update(packed_rows=packed.shape[0], padded_tokens=int(padded.numel()), packed_tokens=int(packed.numel()))
    return row
