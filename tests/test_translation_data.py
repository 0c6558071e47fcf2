"""Translation data: the Ding reader's filters, dedupe and splits, real-file errors, BPE, batching."""

from __future__ import annotations

import pytest
import torch

from zoo.data.bpe import decode, encode, load_bpe, train_bpe
from zoo.data.translation import (
    EOS,
    SPECIALS,
    UNK,
    DataError,
    Pairs,
    collate,
    dedupe,
    ding_splits,
    is_sentence,
    normalise,
    padding_fraction,
    read_ding,
    read_parallel,
    read_tsv,
    split,
    token_batches,
)

DING = """\
# comment line
Abschied {m} | Abschied nehmen | Er verabschiedete sich. :: leave | to take leave | He took leave.
Abpfiff {m} [sport] | Der Schiedsrichter gab den Schlusspfiff. :: final whistle | The referee blew for full-time.
Noch ist nicht aller Tage Abend.; Man soll den Tag nicht vor dem Abend loben. :: It is not over until it is over.; Do not count your chickens.
Deal {m} | Hast du vergessen, was wir abgemacht/ausgemacht haben? :: deal | Are you forgetting our deal?
Ablehnung {f} | eine Absage an etw. :: rejection | a rejection of sth.
Mismatch | Das ist gut. | extra :: mismatch | That is good.
Das Wetter ist schön. :: The weather is nice (today).
Er verabschiedete sich! :: He took leave!
Sie kam zu spät. :: She came late / too late.
"""


@pytest.fixture
def ding(tmp_path):
    path = tmp_path / "de-en"
    path.write_text(DING, encoding="utf-8")
    return path


def test_ding_reader_keeps_whole_sentence_pairs_only(ding):
    pairs = read_ding(ding)
    assert list(zip(pairs.src, pairs.tgt)) == [
        ("Er verabschiedete sich.", "He took leave."),
        ("Der Schiedsrichter gab den Schlusspfiff.", "The referee blew for full-time."),
        ("Noch ist nicht aller Tage Abend.", "It is not over until it is over."),
        ("Man soll den Tag nicht vor dem Abend loben.", "Do not count your chickens."),
        ("Hast du vergessen, was wir abgemacht haben?", "Are you forgetting our deal?"),
        ("Er verabschiedete sich!", "He took leave!"),
    ]
    assert pairs.dropped["sub-entries not aligned"] == 1
    assert pairs.dropped["not a sentence pair"] > 0


@pytest.mark.parametrize(
    "text,ok",
    [
        ("That serves him right.", True),
        ("Is it?", False),  # two words
        ("that serves him right.", False),  # not capitalised
        ("That serves him right", False),  # no final punctuation
        ("He did sth. wrong.", False),  # dictionary shorthand
        ("Er hat jdn. gesehen.", False),
        ("The weather is nice (today).", False),  # bracketed note
        ("She came late / too late.", False),  # spaced alternatives
        ("Wait for it …", False),
    ],
)
def test_sentence_filter(text, ok):
    assert is_sentence(text) is ok


def test_dedupe_on_either_side_and_disjoint_splits(ding):
    pairs = read_ding(ding)
    deduped = dedupe(pairs)
    # "Er verabschiedete sich." and "Er verabschiedete sich!" normalise alike: one is dropped
    assert normalise("Er verabschiedete sich!") == normalise("er VERABSCHIEDETE sich.")
    assert len(deduped) == len(pairs) - 1 and deduped.dropped["duplicate"] == 1
    # digits normalise alike ("Page 3" and "Page 4" are one sentence), so the hundred sentences differ in words
    words = [a + b for a in "bcdfghjklm" for b in "aeiouyprst"]
    many = Pairs([f"Sentence {w} here." for w in words], [f"Satz {w} hier." for w in words])
    parts = split(many, valid=10, test=20, seed=3)
    assert [len(parts[k]) for k in ("train", "valid", "test")] == [70, 10, 20]
    assert split(many, valid=10, test=20, seed=3)["test"].src == parts["test"].src  # deterministic
    seen = [set(map(normalise, parts[k].src)) for k in parts]
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    with pytest.raises(DataError, match="cannot give"):
        split(many, valid=50, test=50)


def test_embedded_default_when_installed():
    from zoo.data.translation import DING_PATH

    if not DING_PATH.is_file():
        with pytest.raises(DataError, match="apt-get install trans-de-en"):
            ding_splits()
        return
    parts, dropped = ding_splits(direction="en-de")
    assert 15_000 < sum(len(p) for p in parts.values()) < 20_000
    train, test = parts["train"], parts["test"]
    assert all(is_sentence(s) and is_sentence(t) for s, t in zip(test.src, test.tgt))
    for side in ("src", "tgt"):
        train_keys = set(map(normalise, getattr(train, side)))
        assert not train_keys & set(map(normalise, getattr(test, side)))
    de_en, _ = ding_splits(direction="de-en")
    assert de_en["test"].src == test.tgt  # the same split, reversed


def test_parallel_files_and_their_errors(tmp_path):
    (tmp_path / "a.en").write_text("One.\nTwo.\n\nFour.\n")
    (tmp_path / "a.de").write_text("Eins.\nZwei.\nDrei.\nVier.\n")
    pairs = read_parallel(tmp_path / "a.en", tmp_path / "a.de")
    assert pairs.src == ["One.", "Two.", "Four."] and pairs.dropped["empty side"] == 1
    (tmp_path / "b.de").write_text("Eins.\n")
    with pytest.raises(DataError, match="has 4 lines but .*b.de has 1"):
        read_parallel(tmp_path / "a.en", tmp_path / "b.de")
    (tmp_path / "empty.de").write_text("  \n")
    with pytest.raises(DataError, match="empty.de is empty"):
        read_parallel(tmp_path / "a.en", tmp_path / "empty.de")
    (tmp_path / "bad.de").write_bytes(b"Eins.\nZw\xffei.\nDrei.\nVier.\n")
    with pytest.raises(DataError, match=r"bad.de:2: not valid UTF-8"):
        read_parallel(tmp_path / "a.en", tmp_path / "bad.de")
    (tmp_path / "p.tsv").write_text("One.\tEins.\nTwo\n")
    with pytest.raises(DataError, match=r"p.tsv:2: expected 2 tab-separated columns"):
        read_tsv(tmp_path / "p.tsv")
    with pytest.raises(DataError, match="no such file"):
        read_tsv(tmp_path / "missing.tsv")


def test_bpe_round_trip_and_specials(tmp_path):
    texts = ["The weather is nice.", "Das Wetter ist schön.", "I’ve made one or two changes."] * 20
    tok = train_bpe(texts, 120, specials=SPECIALS, unk=UNK)
    assert [tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]
    ids = encode(tok, texts[:3], eos=EOS)
    assert all(seq[-1] == 2 for seq in ids)
    assert decode(tok, ids, eos=EOS) == texts[:3]
    assert decode(tok, [ids[0] + [5, 6]], eos=EOS) == [texts[0]]  # stops at </s>
    assert len(encode(tok, texts[:1], eos=EOS, max_len=3)[0]) == 3
    assert tok.encode("ß€", add_special_tokens=False).ids[-2:] == [3, 3]  # characters never seen: <unk>
    byte_level = train_bpe(texts, 300, specials=["<pad>", "<eos>"])  # ... where a byte-level BPE has their bytes
    ids = encode(byte_level, ["ß€"])[0]
    assert min(ids) >= 2 and decode(byte_level, [ids], eos="<eos>")[0].strip() == "ß€"
    tok.save(str(tmp_path / "tokenizer.json"))
    assert load_bpe(tmp_path / "tokenizer.json", specials=SPECIALS).get_vocab() == tok.get_vocab()
    with pytest.raises(DataError, match=r"must hold <pad> <eos> as ids 0-1 \(found ids \[0, None\]\)"):
        load_bpe(tmp_path / "tokenizer.json", specials=["<pad>", "<eos>"])
    with pytest.raises(ValueError, match="unk '<unknown>' must be one of the special tokens"):
        train_bpe(texts, 120, specials=SPECIALS, unk="<unknown>")


def test_token_batches_respect_the_budget_and_cover_everything():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(1, 40, (500,), generator=g).tolist()
    tgt = [max(1, n + int(d)) for n, d in zip(src, torch.randint(-3, 4, (500,), generator=g))]  # translations' lengths correlate
    batches = token_batches(src, tgt, max_tokens=200, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        assert len(b) * max(max(src[i], tgt[i]) for i in b) <= 200
    random_order = [list(range(i, min(i + 8, 500))) for i in range(0, 500, 8)]
    assert padding_fraction(batches, src) < padding_fraction(random_order, src) / 2
    assert token_batches(src, tgt, max_tokens=200, seed=1) == batches
    assert token_batches(src, tgt, max_tokens=200, seed=2) != batches
    with pytest.raises(DataError, match="more than max_tokens"):
        token_batches([300], [3], max_tokens=200)


def test_collate_shifts_targets():
    s, t_in, t_out = collate([[5, 6, 2], [7, 2]], [[8, 9, 2], [4, 2]], [0, 1])
    assert s.tolist() == [[5, 6, 2], [7, 2, 0]]
    assert t_out.tolist() == [[8, 9, 2], [4, 2, 0]]
    assert t_in.tolist() == [[1, 8, 9], [1, 4, 0]]
