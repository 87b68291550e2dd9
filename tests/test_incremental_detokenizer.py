"""IncrementalDetokenizer decodes a window of the last tokens at each update: its deltas must
be those of decoding the whole list at every update (the oracle, `whole_list_deltas`: the
method it replaced), for a byte-level BPE tokenizer (SmolLM2's: Llama 3's, Qwen's and
gpt-oss's decode the same way) and a SentencePiece-style one (byte fallback, "▁" for spaces,
a Strip of the first space: Llama 2's and Mistral's decoder), on text with multi-byte
characters split across tokens, special tokens kept or skipped, and random ids; one token
per update or several (speculative decoding), and a last update without the stop token."""

from __future__ import annotations

import json
import string

import numpy as np
import pytest

from bessemer.runtime.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = ["The quick brown fox, said she, jumps over the lazy dog.\n\n  def f(x):\n\treturn x",
         "héllo wörld: 日本語のテキスト 🙂🚀 naïve café — ünïcödé ﬁ 𝔘",
         "  two  spaces,   three   and a tab\t. 100 + 200 = 300!"]


def whole_list_deltas(tokenizer: Tokenizer, updates: list[list[int]], skip: bool) -> list[str]:
    deltas, text_so_far = [], ""
    for ids in updates:
        text = tokenizer.decode(ids, skip)
        if text.endswith("\ufffd"):
            deltas.append("")
            continue
        deltas.append(text[len(text_so_far):] if text.startswith(text_so_far) else text)
        text_so_far = text
    return deltas


def updates_of(ids: list[int], rng: np.random.Generator) -> list[list[int]]:
    """Growing prefixes, 1 to 3 tokens at a time, then the last again (a stop token
    dropped from the text)."""
    ends, n = [], 0
    while n < len(ids):
        n = min(len(ids), n + int(rng.integers(1, 4)) if rng.random() < 0.3 else n + 1)
        ends.append(n)
    return [ids[:n] for n in ends] + [ids[:ends[-1]]]


def check(tokenizer: Tokenizer, ids: list[int], skip: bool, rng: np.random.Generator) -> None:
    updates = updates_of(ids, rng)
    detok = IncrementalDetokenizer(tokenizer, skip)
    got = [detok.update(u) for u in updates]
    assert got == whole_list_deltas(tokenizer, updates, skip)
    whole = tokenizer.decode(updates[-1], skip)
    if not whole.endswith("\ufffd"):
        assert detok.text == whole


def sentencepiece_style(tmp_path) -> Tokenizer:
    from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{i:02X}>": 3 + i for i in range(256)})
    for c in "▁" + string.ascii_letters + string.digits + ",.!:=+-\n\t":
        vocab[c] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("l", "l"), ("▁", "w"), ("o", "r"), ("▁", "▁")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return Tokenizer(tmp_path)


@pytest.fixture(scope="module")
def tokenizers(smollm2_dir, tmp_path_factory):
    return {"byte-level BPE": (Tokenizer(smollm2_dir), ["<|im_start|>", "<|im_end|>"]),
            "sentencepiece-style": (sentencepiece_style(tmp_path_factory.mktemp("sp")), ["<s>", "</s>"])}


@pytest.mark.parametrize("kind", ["byte-level BPE", "sentencepiece-style"])
def test_deltas_are_those_of_decoding_the_whole_list(tokenizers, kind):
    tokenizer, specials = tokenizers[kind]
    special_ids = [tokenizer._tok.token_to_id(s) for s in specials]
    assert None not in special_ids
    rng = np.random.default_rng(0)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        # a special token at the start, in the middle and at the end, as a chat turn has them
        with_specials = special_ids[:1] + ids[:len(ids) // 2] + special_ids + ids[len(ids) // 2:] + special_ids[1:]
        for sequence in (ids, with_specials):
            for skip in (True, False):
                check(tokenizer, sequence, skip, rng)
    for _ in range(6):  # invalid byte runs, lone continuation bytes, specials anywhere
        ids = rng.integers(0, tokenizer.vocab_size, size=int(rng.integers(20, 120))).tolist()
        check(tokenizer, ids, bool(rng.integers(2)), rng)


def test_a_long_sequence_decodes_a_window_not_the_whole_list(tokenizers):
    # the cost of an update no longer grows with the length: the window holds the last
    # update's tokens and the new ones (counted by wrapping the tokenizer's decode)
    tokenizer, _ = tokenizers["byte-level BPE"]
    ids = tokenizer.encode(TEXTS[0] * 40, add_special_tokens=False)[:600]
    decoded = []

    class Counting:
        def decode(self, token_ids, skip):
            decoded.append(len(token_ids))
            return tokenizer.decode(token_ids, skip)

    detok = IncrementalDetokenizer(Counting(), True)
    for n in range(1, len(ids) + 1):
        detok.update(ids[:n])
    assert detok.text == tokenizer.decode(ids, True)
    assert max(decoded[20:]) <= 8, max(decoded)
