"""Fast checks of the embedded "mini" target builder (dflash_core/prepare/minitarget.py).

The full default build takes minutes; these use tiny configs so each test runs in seconds.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from dflash_core.errors import DFlashError
from dflash_core.prepare import minitarget as mt
from dflash_core.store.artifacts import META_FILE

# A deliberately tiny build: enough to exercise every code path, fast enough for unit tests.
TINY = mt.MiniTargetConfig(
    vocab_size=320,
    hidden_size=32,
    num_layers=2,
    attention_layers=(1,),
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    max_position_embeddings=128,
    seq_len=32,
    batch_size=4,
    max_steps=3,
    train_seconds=600.0,
    corpus_files=5,
    threads=1,  # the 2-thread default crawls when other jobs share the 2 cores; 1 keeps this fast
)


def test_corpus_is_pinned_sorted_and_hashed() -> None:
    files = mt.corpus_files(TINY)
    assert len(files) == 5
    assert all(f.name.startswith("modeling_") and f.suffix == ".py" for f in files)
    rel = [f"{f.parent.name}/{f.name}" for f in files]
    assert rel == sorted(rel)
    texts = mt.corpus_texts(TINY)
    assert mt.corpus_sha256(texts) == mt.corpus_sha256(mt.corpus_texts(TINY))


def test_corpus_refuses_other_transformers_version(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda n: "9.9.9" if n == "transformers" else real(n))
    with pytest.raises(DFlashError, match="pinned to transformers==5.24.0"):
        mt.corpus_texts(TINY)


def test_tokenizer_round_trip_offline(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = mt.train_tokenizer(mt.corpus_texts(TINY), TINY)
    assert len(tok) == TINY.vocab_size
    assert [tok.convert_tokens_to_ids(t) for t in mt.SPECIAL_TOKENS] == [0, 1, 2]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)

    text = "def forward(self, hidden_states):\n    return x  # naïve ✓ 1e-5\n"
    bare = loaded(text, add_special_tokens=False)["input_ids"]
    assert 1 not in bare and 2 not in bare  # no specials unless asked
    assert loaded(text)["input_ids"] == [1, *bare]  # BOS prepended, no EOS appended
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.decode(bare) == text  # byte-level: lossless
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)


def test_tokenizer_training_is_deterministic() -> None:
    texts = mt.corpus_texts(TINY)
    a = mt.train_tokenizer(texts, TINY).backend_tokenizer.to_str()
    b = mt.train_tokenizer(texts, TINY).backend_tokenizer.to_str()
    assert a == b


def test_config_has_conv_and_attention_layers() -> None:
    cfg = mt.model_config(mt.MiniTargetConfig())
    assert "conv" in cfg.layer_types and "full_attention" in cfg.layer_types
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == list(
        mt.MiniTargetConfig().attention_layers
    )
    assert cfg.tie_word_embeddings and not cfg.block_auto_adjust_ff_dim
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)
    with pytest.raises(ValueError):
        mt.model_config(mt.with_size(TINY, attention_layers=()))
    with pytest.raises(ValueError):
        mt.model_config(mt.with_size(TINY, attention_layers=(0, 1)))


def test_short_build_is_deterministic(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    meta_a = mt.build_mini_target(tmp_path / "a", TINY, progress=False)
    meta_b = mt.build_mini_target(tmp_path / "b", TINY, progress=False)
    blob_a = (tmp_path / "a" / "model.safetensors").read_bytes()
    blob_b = (tmp_path / "b" / "model.safetensors").read_bytes()
    assert blob_a == blob_b
    assert meta_a["steps"] == meta_b["steps"] == TINY.max_steps
    assert not meta_a["time_cap_hit"]
    assert meta_a["final_loss"] == meta_b["final_loss"]
    assert meta_a["corpus"]["sha256"] == meta_b["corpus"]["sha256"]
    assert meta_a["tokenizer_vocab_size"] == TINY.vocab_size
    assert (tmp_path / "a" / META_FILE).is_file()

    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a"), local_files_only=True, dtype="float32")
    assert type(model).__name__ == "Lfm2ForCausalLM"
    assert next(model.parameters()).dtype.is_floating_point
    assert str(next(model.parameters()).dtype) == "torch.float32"
    assert isinstance(mt.sample_greedy(tmp_path / "a", "def f(x):", n_tokens=4), str)
