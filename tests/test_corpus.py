"""The embedded EN-DE corpus: domains read from a Ding file and catalog folders written here,
near-duplicates removed over all domains before the split, per-domain splits, fingerprints, the
errors, and per-domain scoring."""

from __future__ import annotations

import random

import pytest
from conftest import DE_NOUNS, NOUNS, messages, write_catalog
from sacrebleu.metrics import BLEU, CHRF
from translate_eval import score_domains  # recipes/, on pytest's path

from zoo.data.common import DataError
from zoo.data.corpus import build_corpus, catalog_packages, fingerprint, parse_corpus, write_tsv
from zoo.data.translation import Pairs, normalise, read_tsv


@pytest.fixture
def world(tmp_path):
    """A Ding file with 80 sentence pairs and two message packages, one of the second domain."""
    ding = tmp_path / "de-en"
    rows = [f"Das ist Satz Nummer {w}. :: This is sentence number {w}." for w in
            ("eins zwei drei vier fünf sechs sieben acht neun zehn".split())]
    rows += [f"Er sah {a} {b}. :: He saw {ea} {eb}." for a, ea in (("den", "the"), ("einen", "a"))
             for b, eb in zip(["Hund", "Vogel", "Baum", "Fluss", "Berg", "Wagen", "Turm", "Mond", "Stern", "Zug",
                               "Ball", "Hut", "Tisch", "Stuhl", "Krug", "Schuh", "Fisch", "Knopf", "Zaun", "Korb",
                               "Topf", "Bach", "Weg", "Hof", "Pilz", "Keks", "Wal", "Bär", "Hai", "Elch", "Luchs",
                               "Dachs", "Igel", "Fuchs", "Wolf"],
                              ["dog", "bird", "tree", "river", "mountain", "car", "tower", "moon", "star", "train",
                               "ball", "hat", "table", "chair", "jug", "shoe", "fish", "button", "fence", "basket",
                               "pot", "brook", "path", "yard", "mushroom", "cookie", "whale", "bear", "shark", "elk",
                               "lynx", "badger", "hedgehog", "fox", "wolf"])]
    ding.write_text("\n".join(rows) + "\n", encoding="utf-8")
    catalogs = tmp_path / "catalogs"
    (catalogs / "pkg-a").mkdir(parents=True)
    (catalogs / "pkg-b").mkdir()
    (catalogs / "pkg-s").mkdir()
    write_catalog(catalogs / "pkg-a" / "a.mo", messages("A") + [("This is sentence number eins.", "Anders übersetzt.")])
    write_catalog(catalogs / "pkg-b" / "b.mo", messages("B") + [("OK", "OK")])
    (catalogs / "pkg-b" / "broken.mo").write_bytes(b"not a catalog at all")
    write_catalog(catalogs / "pkg-s" / "s.mo", [(f"The hero walks {k} to {n}.", f"Der Held geht {dk} zu {dn}.")
                                                for k, dk in (("north", "nach Norden"), ("south", "nach Süden"),
                                                              ("east", "nach Osten"))
                                                for n, dn in zip(NOUNS, DE_NOUNS)]
                  + [(f"Run to the {n}!", f"Lauf zu {dn}!") for n, dn in zip(NOUNS, DE_NOUNS)])
    listing = tmp_path / "catalogs.txt"
    listing.write_text("# domain package\nmessages pkg-a\nmessages pkg-b\nmessages pkg-gone\nstories pkg-s\n")
    return dict(ding_path=ding, catalogs=catalogs, catalog_list=listing)


def test_parse_corpus():
    assert parse_corpus("both") == ("ding", "messages")
    assert parse_corpus("all") == ("ding", "messages", "stories")
    assert parse_corpus("stories+ding") == ("ding", "stories")
    with pytest.raises(DataError, match="unknown domain 'mesages'.*both"):
        parse_corpus("ding+mesages")


def test_the_shipped_list_names_packages_of_each_domain():
    assert len(catalog_packages("messages")) >= 40 and "gcc-12-locales" in catalog_packages("messages")
    assert catalog_packages("stories") and not set(catalog_packages("messages")) & set(catalog_packages("stories"))


def test_domains_dedupe_and_split(world):
    corpus = build_corpus("all", valid=10, test=20, **world)
    assert corpus.domains == ["ding", "messages", "stories"]
    assert corpus.missing_packages == ["pkg-gone"]
    assert [u[0].endswith("broken.mo") for u in corpus.unreadable] == [True]
    msg = corpus.stats["messages"]
    # 2 x 100 distinct pairs + 2 x 2 near-duplicates of each other ("Cannot open file {path} (error 2)" ~
    # "cannot OPEN file %s: error 17") of which the first stays, + a source equal to a Ding sentence's
    assert msg["pairs"] == 201 and msg["dropped"]["near-duplicate"] == 4
    assert msg["dropped"]["untranslated (msgstr == msgid)"] == 1
    assert corpus.stats["ding"]["pairs"] == 80 and corpus.stats["stories"]["pairs"] == 40
    for domain, parts in corpus.splits.items():
        assert [len(parts[k]) for k in ("valid", "test")] == [10, 20]
        assert len(parts["train"]) == corpus.stats[domain]["pairs"] - 30
    # no normalised source or target of any valid or test pair appears in any training pair, of any domain
    train = corpus.union("train")
    for side in ("src", "tgt"):
        seen = set(map(normalise, getattr(train, side)))
        for parts in corpus.splits.values():
            for name in ("valid", "test"):
                assert not seen & set(map(normalise, getattr(parts[name], side)))
    assert len(train) == sum(len(p["train"]) for p in corpus.splits.values())


def test_split_is_deterministic_and_fingerprint_order_free(world):
    a = build_corpus("both", valid=5, test=10, **world)
    b = build_corpus("both", valid=5, test=10, **world)
    assert a.splits["messages"]["test"].src == b.splits["messages"]["test"].src
    assert a.stats["messages"]["sha256"] == b.stats["messages"]["sha256"]
    p = a.union("train")
    order = list(range(len(p)))
    random.Random(0).shuffle(order)
    shuffled = Pairs([p.src[i] for i in order], [p.tgt[i] for i in order])
    assert fingerprint(shuffled) == fingerprint(p) != fingerprint(Pairs(p.src[1:], p.tgt[1:]))
    # another split seed moves pairs between splits but leaves each domain's corpus (and fingerprint) alone
    c = build_corpus("both", valid=5, test=10, seed=7, **world)
    assert c.stats["messages"]["sha256"] == a.stats["messages"]["sha256"]
    assert c.splits["messages"]["test"].src != a.splits["messages"]["test"].src


def test_direction_and_errors(world, tmp_path):
    en_de = build_corpus("messages", valid=5, test=10, **world)
    de_en = build_corpus("messages", valid=5, test=10, direction="de-en", **world)
    assert de_en.splits["messages"]["test"].src == en_de.splits["messages"]["test"].tgt
    with pytest.raises(DataError, match="'stories' domain has 40 pairs.*too few"):
        build_corpus("stories", valid=20, test=20, **world)
    with pytest.raises(DataError, match="no German message catalogs at .*tools/install-data"):
        build_corpus("messages", **{**world, "catalogs": tmp_path / "nowhere"})
    with pytest.raises(DataError, match="direction"):
        build_corpus("ding", direction="en-fr", **world)


def test_write_tsv_round_trips(world, tmp_path):
    corpus = build_corpus("both", valid=5, test=10, **world)
    path = tmp_path / "test.messages.tsv"
    write_tsv(corpus.splits["messages"]["test"], path)
    back = read_tsv(path)
    assert (back.src, back.tgt) == (corpus.splits["messages"]["test"].src, corpus.splits["messages"]["test"].tgt)


def test_score_domains_is_sacrebleu_on_each_domain_and_on_all():
    hyps = ["Der Hund bellt laut.", "Datei öffnen", "Kann %s nicht finden", "Er kam spät nach Hause."]
    refs = ["Der Hund bellt.", "Datei öffnen", "Kann %s nicht öffnen", "Er kam spät heim."]
    doms = ["ding", "messages", "messages", "ding"]
    got = score_domains(hyps, refs, doms)
    assert list(got) == ["ding", "messages", "all"]
    for d in ("ding", "messages"):
        h = [x for x, y in zip(hyps, doms) if y == d]
        r = [x for x, y in zip(refs, doms) if y == d]
        assert got[d]["bleu"] == round(BLEU().corpus_score(h, [r]).score, 2)
        assert got[d]["chrf"] == round(CHRF().corpus_score(h, [r]).score, 2)
    assert got["all"]["bleu"] == round(BLEU().corpus_score(hyps, [refs]).score, 2)
    # corpus-level over all sentences, not the mean of the domains
    assert got["all"]["bleu"] != round((got["ding"]["bleu"] + got["messages"]["bleu"]) / 2, 2)
    with pytest.raises(ValueError, match="domain labels"):
        score_domains(hyps, refs, doms[:3])


def test_union_repeats_a_domain(world):
    corpus = build_corpus("both", valid=5, test=10, **world)
    once, twice = corpus.union("train"), corpus.union("train", {"ding": 2})
    ding = corpus.splits["ding"]["train"]
    assert len(twice) == len(once) + len(ding)
    assert twice.src[: 2 * len(ding)] == ding.src * 2 and twice.src[2 * len(ding):] == corpus.splits["messages"]["train"].src
    with pytest.raises(DataError, match="cannot repeat stories"):
        corpus.union("train", {"stories": 2})
