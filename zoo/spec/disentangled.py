"""The specs of DeBERTa's disentangled attention (``attention.kind: disentangled``) and the shared
table of relative-position embeddings it reads (``position.kind: relative_embedding``): each score
is content-to-content plus content-to-position and position-to-content terms against one table of
relative distances that every layer shares (He et al. 2021; HF ``DisentangledSelfAttention``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_serializer, model_validator

from zoo.spec.base import register_specs
from zoo.spec.parts import AttentionSpec
from zoo.spec.positions import PositionSpec

__all__ = ["DisentangledSpec", "RelativeEmbeddingSpec"]


class DisentangledSpec(AttentionSpec):
    """Disentangled attention (DeBERTa; HF ``DisentangledSelfAttention``): the score of query i and
    key j is ``q_i·k_j + c2p + p2c``, where c2p is ``q_i·pk[d(i, j)]`` and p2c ``k_j·pq[d(i, j)]``,
    ``pk`` and ``pq`` the keys and queries of the position's relative-embedding rows (through the
    content projections with ``share_key``, else through projections of their own, ``pos_k`` and
    ``pos_q``) and d(i, j) the bucket of i - j. Every term is divided by sqrt(head size * (1 + the
    number of position terms)). The layer's position must be ``relative_embedding``, which holds the
    table and the buckets. Self-attention of an encoder; no cache."""

    kind: Literal["disentangled"] = "disentangled"
    c2p: bool = Field(True, description="the content-to-position term, the query against the relative keys (HF pos_att_type c2p)")
    p2c: bool = Field(True, description="the position-to-content term, the key against the relative queries (HF pos_att_type p2c)")
    share_key: bool = Field(True, description="the relative embeddings pass through the content query and key projections "
                            "(HF share_att_key); false: through projections of their own (pos_q, pos_k, with biases)")

    @model_serializer(mode="wrap")
    def _leave_out_derived(self, handler: Any) -> dict:
        data = handler(self)
        data.pop("n_kv_heads", None)
        return data

    @model_validator(mode="after")
    def _check_disentangled(self) -> DisentangledSpec:
        if self.n_kv_heads != self.n_heads:
            raise ValueError(f"n_kv_heads: disentangled attention has a key head per query head, so n_kv_heads is "
                             f"n_heads ({self.n_heads}), got {self.n_kv_heads}; leave n_kv_heads out")
        for name, value, fix in (("qk_norm", self.qk_norm, "remove qk_norm"), ("window", self.window, "remove window"),
                                 ("softcap", self.softcap, "remove softcap"), ("scale", self.scale, "remove scale"),
                                 ("scale_dim", self.scale_dim, "remove scale_dim")):
            if value is not None:
                raise ValueError(f"{name}: disentangled attention scales its three terms by 1/sqrt(head size * terms) "
                                 f"and has no {name}; {fix}")
        for name, bad in (("sinks", self.sinks), ("gate", self.gate), ("chunk", self.chunk is not None),
                          ("temperature", self.temperature is not None)):
            if bad:
                raise ValueError(f"{name}: disentangled attention has no {name}; remove {name}")
        if not self.key_bias:
            raise ValueError("key_bias: disentangled attention's key projection also maps the relative embeddings; "
                             "remove key_bias")
        if self.v_head_dim is not None and self.head_dim is not None and self.v_head_dim != self.head_dim:
            raise ValueError(f"v_head_dim: disentangled attention's heads are one size ({self.head_dim}); leave "
                             f"v_head_dim out")
        return self

    @property
    def terms(self) -> int:
        """How many terms make a score: content-to-content, and c2p and p2c where present."""
        return 1 + self.c2p + self.p2c

    def score_scale(self, d_model: int) -> float | None:
        """1/sqrt(head size * :attr:`terms`)."""
        return (self.qk_size(d_model) * self.terms) ** -0.5

    def v_size(self, d_model: int) -> int:
        return self.qk_size(d_model)


class RelativeEmbeddingSpec(PositionSpec):
    """A learned table of relative-position embeddings [2 * span, d_model] shared by a stack's layers,
    with a LayerNorm over it (``norm``; HF norm_rel_ebd: layer_norm), read by disentangled attention.
    The distance i - j of query i and key j falls in a bucket: itself while |i - j| is under
    ``buckets // 2``, else a logarithmic bucket reaching ``buckets - 1`` at ``max_distance - 1``
    (HF's make_log_bucket_position); ``buckets: null`` keeps distances as they are, the span being
    ``max_distance``. The span is ``buckets`` (else ``max_distance``); rows span + d are read,
    clamped to the table. Adds nothing to the embeddings."""

    kind: Literal["relative_embedding"] = "relative_embedding"
    in_layers: ClassVar[bool] = True
    per_stack: ClassVar[bool] = True
    buckets: PositiveInt | None = Field(256, description="log buckets of relative distance (HF position_buckets); "
                                        "null: distances unbucketed, the span max_distance")
    max_distance: PositiveInt = Field(512, description="the distance whose bucket is buckets - 1 (HF max_relative_positions, "
                                      "else max_position_embeddings)")
    norm: bool = Field(True, description="a LayerNorm over the table (HF norm_rel_ebd: layer_norm)")
    eps: PositiveFloat = Field(1e-7, description="the table's LayerNorm eps (HF layer_norm_eps)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the (normalised) table in training (HF's "
                           "pos_dropout, at hidden_dropout_prob)")

    @property
    def span(self) -> int:
        """Half the table's rows: ``buckets``, else ``max_distance``."""
        return self.buckets or self.max_distance

    def problems(self, *, d_model: int, head_dim: int, field: str) -> list[str]:
        if self.buckets is not None and self.buckets < 4:
            return [f"{field}.buckets: half the buckets hold one distance each, so buckets >= 4, got {self.buckets}; "
                    f"use e.g. 256"]
        if self.buckets is not None and self.max_distance <= self.buckets // 2 + 1:
            return [f"{field}.max_distance: the log buckets reach from buckets // 2 to max_distance, so it must exceed "
                    f"{self.buckets // 2 + 1}, got {self.max_distance}; use e.g. {2 * self.buckets}"]
        return []


register_specs("attention", AttentionSpec, {"disentangled": DisentangledSpec})
register_specs("position", PositionSpec, {"relative_embedding": RelativeEmbeddingSpec})
