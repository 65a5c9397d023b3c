"""The offline model directory ``simkv validate --paged`` runs OpenVINO GenAI's ``ContinuousBatchingPipeline`` on.

Lightest path, no download, no torch, no transformers:

* ``openvino_model.xml`` is the random-weight stateful decoder of :mod:`..openvino.ovmodel` (the form
  optimum-intel exports: ``input_ids, attention_mask, position_ids, beam_idx``, ReadValue ->
  Gather(beam_idx) -> Concat -> SDPA per layer). GenAI turns it into its paged form itself
  (``paged_attention_transformation``: the per-layer state becomes ``key_cache.N`` /
  ``value_cache.N`` inputs); measured with openvino-genai 2026.4.1: the pipeline builds and
  generates on CPU. Its logits get a -1e9 bias on the prompt id range, so generated tokens never
  coincide with prompt tokens (prefix-cache matches stay exactly those a workload declares).
* ``openvino_tokenizer.xml`` / ``openvino_detokenizer.xml``: a word-level tokenizer trained
  locally with ``tokenizers`` (WordLevelTrainer on a generated corpus) and turned into IRs with
  openvino-tokenizers' pipeline steps (whitespace split + vocab encoder; vocab decoder + fuse).
  ``convert_tokenizer`` would need ``transformers``; the steps it would produce for a WordLevel
  tokenizer are used directly. The validator adds requests as token ids, so the tokenizer only
  makes the directory a complete GenAI model directory (``pipeline.get_tokenizer()``, text
  prompts); the pipeline also builds without it.
* ``generation_config.json`` (``eos_token_id``) and ``config.json`` (the shape, informational).

The directory is cached under ``$SIMKV_CACHE_DIR`` (default ``~/.cache/simkv``) by shape, seed
and library versions, built in a temporary sibling and renamed, so a repeated run finds it in
milliseconds and concurrent runs never see half a directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["GenaiModelSpec", "EOS_TOKEN_ID", "cache_root", "model_dir"]

#: Reserved ids of the toy vocabulary: 0 <unk>, 1 <bos>, 2 <eos>.
EOS_TOKEN_ID = 2
#: Prompts use ids in [PROMPT_ID_START, PROMPT_ID_END); the model never generates an id below
#: PROMPT_ID_END (its logits there are -1e9), so generated tokens never look like prompt tokens.
PROMPT_ID_START, PROMPT_ID_END = 3, 259
#: Bound on the toy model's weights (f32: 200 MB), so odd shape flags fail fast instead of filling memory.
MAX_PARAMS = 50_000_000
SPECIAL_TOKENS = ("<unk>", "<bos>", "<eos>")
_DONE = ".complete"


@dataclass(frozen=True)
class GenaiModelSpec:
    """Shape of the toy model. Small on purpose: the schedule and the pool do not depend on
    the weights, and every step of a validation run costs real CPU time on a shared machine."""

    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    vocab: int = 1000  # ids >= PROMPT_ID_END (259) are the ones it generates
    seed: int = 0
    with_tokenizer: bool = True
    #: Hidden size (default heads x head dim); ``simkv validate --serving`` runs a real head shape
    #: (16/8 heads x 128) on hidden 1,024.
    hidden: int | None = None

    @property
    def hidden_size(self) -> int:
        return self.hidden if self.hidden is not None else self.heads * self.head_dim

    @property
    def params(self) -> int:
        """Weights of the attention-only decoder (Q, K, V, O per layer; embedding and head)."""
        hidden, q, kv = self.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.layers * (2 * hidden * q + 2 * hidden * kv) + 2 * self.vocab * hidden

    def __post_init__(self) -> None:
        if self.vocab <= PROMPT_ID_END:
            raise ValueError(f"vocab must exceed {PROMPT_ID_END} (the prompt id range the model never generates)")
        if min(self.layers, self.heads, self.kv_heads, self.head_dim) < 1:
            raise ValueError("layers, heads, kv heads and head dim must be positive")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError("heads must be a multiple of kv heads, and head dim even")
        if self.hidden is not None and self.hidden < 1:
            raise ValueError("hidden must be positive")
        params = self.params
        if params > MAX_PARAMS:
            raise ValueError(f"the toy model would hold {params:,} weights; a real validation run takes at most "
                             f"{MAX_PARAMS:,} (the schedule does not depend on the model's size)")

    def key(self) -> str:
        import openvino as ov

        try:
            from importlib.metadata import version

            tok = version("openvino-tokenizers") if self.with_tokenizer else "none"
        except Exception:  # pragma: no cover - metadata missing
            tok = "unknown"
        return (f"genai-toy-v2-L{self.layers}-H{self.heads}-KV{self.kv_heads}-S{self.head_dim}-V{self.vocab}"
                f"{'' if self.hidden is None else f'-D{self.hidden}'}-seed{self.seed}-ov{ov.__version__.split('-')[0]}-tok{tok}")


def cache_root() -> Path:
    return Path(os.environ.get("SIMKV_CACHE_DIR") or Path.home() / ".cache" / "simkv")


def _write_tokenizer(spec: GenaiModelSpec, out: Path) -> None:
    """Train a word-level tokenizer over ``vocab`` words and write tokenizer/detokenizer IRs."""
    import openvino as ov
    from openvino_tokenizers.tokenizer_pipeline import (
        CombineSegmentsStep,
        FuseStep,
        PaddingStep,
        RegexDecodingStep,
        Sequence,
        SpecialTokensSplit,
        TokenizerPipeline,
        VocabDecoderStep,
        VocabEncoderStep,
        WhitespaceSplitStep,
    )
    from openvino_tokenizers.utils import change_inputs_type, change_outputs_type
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    words = [f"w{i}" for i in range(spec.vocab - len(SPECIAL_TOKENS))]
    tok = Tokenizer(models.WordLevel(unk_token=SPECIAL_TOKENS[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(vocab_size=spec.vocab, special_tokens=list(SPECIAL_TOKENS))
    # Every word once, in order: frequencies tie, so ids follow first appearance after the specials.
    tok.train_from_iterator([" ".join(words)], trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    vocab = [""] * tok.get_vocab_size()
    for token, idx in tok.get_vocab().items():
        vocab[idx] = token

    # The steps openvino-tokenizers' hf_parser emits for a WordLevel tokenizer.json, in its order.
    pipeline = TokenizerPipeline()
    pipeline.add_steps([
        SpecialTokensSplit.from_string_iter(SPECIAL_TOKENS),
        WhitespaceSplitStep(),
        VocabEncoderStep(vocab, default_value=0),
        CombineSegmentsStep([Sequence()], add_special_tokens=False),
        PaddingStep(token=SPECIAL_TOKENS[0], _token_id=0),
        VocabDecoderStep(vocab=[f" {t}" for t in vocab], skip_tokens=list(range(len(SPECIAL_TOKENS)))),
        FuseStep(),
        RegexDecodingStep.strip_forward_space(),
    ])
    pipeline.vocab = vocab
    # i64 ids in and out, as convert_tokenizer's defaults (GenAI feeds the model i64 input_ids).
    tokenizer = change_outputs_type(pipeline.get_tokenizer_ov_subgraph(), ov.Type.i64)
    detokenizer = change_inputs_type(pipeline.get_detokenizer_ov_subgraph(), ov.Type.i64)
    for model in (tokenizer, detokenizer):
        model.set_rt_info(EOS_TOKEN_ID, "eos_token_id")
        model.set_rt_info(1, "bos_token_id")
        model.set_rt_info(0, "pad_token_id")
    ov.save_model(tokenizer, str(out / "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, str(out / "openvino_detokenizer.xml"))


def _mask_prompt_ids(model, vocab: int) -> None:
    """logits += bias with -1e9 on ids < PROMPT_ID_END: greedy, multinomial and beam search never pick them."""
    import numpy as np
    import openvino.opset13 as ops

    bias = np.zeros(vocab, np.float32)
    bias[:PROMPT_ID_END] = -1e9
    result = model.get_results()[0]
    logits = result.input_value(0)
    biased = ops.add(logits, ops.constant(bias))
    logits.get_tensor().set_names(set())
    biased.output(0).set_names({"logits"})
    result.input(0).replace_source_output(biased.output(0))
    model.validate_nodes_and_infer_types()


def _build(spec: GenaiModelSpec, out: Path) -> None:
    import openvino as ov

    from ..openvino.ovmodel import build_stateful_decoder
    from ..openvino.toy import ToyDecoderSpec

    model = build_stateful_decoder(ToyDecoderSpec(layers=spec.layers, heads=spec.heads, kv_heads=spec.kv_heads,
                                                  head_dim=spec.head_dim, hidden=spec.hidden, vocab=spec.vocab,
                                                  seed=spec.seed))
    _mask_prompt_ids(model, spec.vocab)
    ov.save_model(model, str(out / "openvino_model.xml"))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_TOKEN_ID, "bos_token_id": 1,
                                                            "pad_token_id": 0}, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps({"model_type": "simkv-toy", **asdict(spec)}, indent=1) + "\n")
    if spec.with_tokenizer:
        _write_tokenizer(spec, out)


def model_dir(spec: GenaiModelSpec = GenaiModelSpec(), root: str | Path | None = None) -> Path:
    """The cached model directory for ``spec``, built on first use (about a second)."""
    root = Path(root) if root is not None else cache_root()
    final = root / spec.key()
    if (final / _DONE).exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        _build(spec, tmp)
        (tmp / _DONE).write_text("ok\n")
        try:
            tmp.rename(final)
        except OSError:  # another process finished first (or a stale incomplete dir): use or replace it
            if not (final / _DONE).exists():
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
