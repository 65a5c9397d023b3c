"""The toy decoder of ``simkv validate`` and ``simkv calibrate``: its shape, as the CPU plugin runs it and as
the cost model prices it.

:class:`ToyDecoderSpec` is the shape :func:`.ovmodel.build_stateful_decoder` builds; :func:`toy_model_spec`
is the same decoder as a :class:`~simkv.models.ModelSpec` for the cost model (the latency check's predictions,
the weight bytes ``simkv calibrate`` divides by). No OpenVINO here, so the pure parts of the latency check
import it without the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simkv.models import ModelSpec

__all__ = ["ToyDecoderSpec", "toy_model_spec"]


@dataclass(frozen=True)
class ToyDecoderSpec:
    """Shape of the random-weight decoder built by :func:`.ovmodel.build_stateful_decoder`.

    Only the attention path matters for KV memory, so the block is attention-only
    (RMSNorm -> q/k/v projections -> RoPE -> cached SDPA -> output projection ->
    residual); an MLP would add compute on a 2-core machine without changing a KV byte.
    """

    layers: int = 2
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    hidden: int | None = None  # default: heads * head_dim
    vocab: int = 1000
    seed: int = 0
    rope_theta: float = 10000.0
    #: "bidirectional" (transformers/optimum form, fused) or "numpy" (Broadcast to an
    #: explicit target shape: NOT matched by StatefulSDPAFusion; only for testing that
    #: unfused models are refused).  Ignored for MHA.
    gqa_broadcast: str = "bidirectional"
    #: Layers that are linear attention instead (a hybrid model): each keeps a conv state
    #: ``[B, hidden, conv_kernel]`` and a recurrent state ``[B, heads, head_dim, head_dim]`` as plain
    #: ReadValue/Assign variables, as a Qwen3-Next export does (a toy delta-rule, not Gated DeltaNet).
    linear_layers: tuple[int, ...] = ()
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        if self.gqa_broadcast not in ("bidirectional", "numpy"):
            raise ValueError("gqa_broadcast must be 'bidirectional' or 'numpy'")
        if any(not 0 <= i < self.layers for i in self.linear_layers) or len(set(self.linear_layers)) == self.layers:
            raise ValueError("linear_layers must be distinct layers, and at least one layer must be attention")
        if self.conv_kernel < 1:
            raise ValueError("conv_kernel must be >= 1")
        if self.layers < 1 or self.heads < 1 or self.kv_heads < 1:
            raise ValueError("layers, heads and kv_heads must be >= 1")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (RoPE rotates pairs of halves)")

    @property
    def hidden_size(self) -> int:
        return self.hidden if self.hidden is not None else self.heads * self.head_dim

    @property
    def params(self) -> int:
        """Weights :func:`.ovmodel.build_stateful_decoder` draws: embedding and output matrices, and per attention
        layer the q, k, v and output projections (a linear-attention layer counts as one, a bound)."""
        d, s = self.hidden_size, self.head_dim
        return 2 * self.vocab * d + self.layers * d * s * (2 * self.heads + 2 * self.kv_heads)

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (1 = MHA, >1 = GQA, ``heads`` = MQA)."""
        return self.heads // self.kv_heads


def toy_model_spec(model: ModelSpec, hidden: int, vocab: int) -> ModelSpec:
    """The validator's toy decoder as a cost-model shape: attention-only (no MLP matrices)."""
    return replace(model, hidden=hidden, intermediate=hidden, vocab=vocab, mlp_matrices=0, tied_embeddings=False)
