"""German message catalogs: the .mo reader (plural, context, charset, header), the cleaning rules,
and unreadable catalogs skipped with their reason. The catalogs are written here with Babel."""

from __future__ import annotations

import pytest
from conftest import write_catalog

from zoo.data.common import DataError
from zoo.data.messages import PLACEHOLDER, clean_pair, read_catalog, read_catalogs
from zoo.data.translation import normalise


def test_reader_plural_context_header_and_charset(tmp_path):
    path = write_catalog(tmp_path / "a.mo", [
        ("Open file", "Datei öffnen"),
        (("%d file was removed", "%d files were removed"), ("%d Datei wurde entfernt", "%d Dateien wurden entfernt")),
        ("Save", "Sichern", "menu"),
        ("Größe", "Größe"),
    ], charset="iso-8859-1")
    entries = dict(read_catalog(path))
    # the header (msgid "") is left out; a context does not leak into the msgid; latin-1 decodes
    assert entries == {
        "Open file": "Datei öffnen",
        "%d file was removed": "%d Datei wurde entfernt",  # a plural entry: singular with the first form
        "Save": "Sichern",
        "Größe": "Größe",
    }


@pytest.mark.parametrize("msgid, msgstr, expect", [
    ("Cannot open\n  the file   %s.", "Kann die Datei %s\nnicht öffnen.", ("Cannot open the file %s.", "Kann die Datei %s nicht öffnen.")),
    ("_Open", "Ö_ffnen", ("Open", "Öffnen")),
    ("Save _As…", "Speichern _unter …", ("Save As…", "Speichern unter …")),
    ("&File", "&Datei", ("File", "Datei")),
    ("invalid max_connections", "ungültige max_connections", ("invalid max_connections", "ungültige max_connections")),
    ("Tom &amp; Jerry", "Tom &amp; Jerry und Co", ("Tom &amp; Jerry", "Tom &amp; Jerry und Co")),
    ("%1$s of %2$s", "%1$s von %2$s", ("%1$s of %2$s", "%1$s von %2$s")),
    ("%(count)d items in {folder}", "%(count)d Einträge in {folder}", ("%(count)d items in {folder}", "%(count)d Einträge in {folder}")),
    ("Set $HOME first", "Zuerst $HOME setzen", ("Set $HOME first", "Zuerst $HOME setzen")),
    ("Cancel", "", "untranslated (empty msgstr)"),
    ("Cancel", "   ", "untranslated (empty msgstr)"),
    ("OK", "OK", "untranslated (msgstr == msgid)"),
    ("OK ", " OK", "untranslated (msgstr == msgid)"),
    ("%s: %d", "%s: %d", "untranslated (msgstr == msgid)"),
    ("%s (%d)", "%s [%d]", "no letters"),
    ("--", "—", "no letters"),
    (" ".join(["word"] * 81), " ".join(["Wort"] * 81), "longer than 80 words"),
])
def test_clean_pair(msgid, msgstr, expect):
    assert clean_pair(msgid, msgstr) == expect


@pytest.mark.parametrize("text, found", [
    ("%s", ["%s"]), ("%-10.3lu", ["%-10.3lu"]), ("%1$s", ["%1$s"]), ("%<PRIu64>", ["%<PRIu64>"]),
    ("%(name)s", ["%(name)s"]), ("{name}", ["{name}"]), ("{0:>4}", ["{0:>4}"]), ("{}", ["{}"]), ("%1", ["%1"]),
    ("$VAR and ${HOME}", ["$VAR", "${HOME}"]), ("100% sure", []),
])
def test_placeholders(text, found):
    assert PLACEHOLDER.findall(text) == found


def test_normalise_collapses_placeholders_digits_case_punctuation():
    assert normalise("Cannot open %s: error 2.") == normalise("cannot  open {path} (error 17)") == "cannot open 0 error 0"
    assert normalise("Datei »%1$s« nicht gefunden!") == normalise("datei „{0}“ nicht gefunden")
    assert normalise("file_name") == normalise("file name")
    assert normalise("Datei öffnen") != normalise("Datei schließen")


def test_unreadable_catalogs_are_skipped_with_a_reason(tmp_path):
    good = write_catalog(tmp_path / "good.mo", [("Open file", "Datei öffnen"), ("OK", "OK"), ("%s", "%s:")])
    raw = good.read_bytes()
    (tmp_path / "magic.mo").write_bytes(b"\x00\x01\x02\x03" + raw[4:])
    (tmp_path / "cut.mo").write_bytes(raw[:30])
    utf8 = write_catalog(tmp_path / "utf8.mo", [("Size", "Größe")]).read_bytes()
    assert "ö".encode() in utf8
    (tmp_path / "undecodable.mo").write_bytes(utf8.replace("ö".encode(), b"\xff\xfe"))  # not UTF-8, same length
    paths = [tmp_path / n for n in ("magic.mo", "good.mo", "cut.mo", "undecodable.mo", "missing.mo")]
    pairs = read_catalogs(paths)
    assert list(zip(pairs.src, pairs.tgt)) == [("Open file", "Datei öffnen")]
    assert pairs.origin == ["good"]
    assert pairs.dropped == {"untranslated (msgstr == msgid)": 1, "no letters": 1}
    reasons = dict(pairs.unreadable)
    assert set(reasons) == {str(p) for p in paths if p.name != "good.mo"}
    assert "magic" in reasons[str(tmp_path / "magic.mo")].lower()
    assert "truncated" in reasons[str(tmp_path / "cut.mo")] or "corrupt" in reasons[str(tmp_path / "cut.mo")].lower()
    assert "undecodable" in reasons[str(tmp_path / "undecodable.mo")]
    assert "no such catalog" in reasons[str(tmp_path / "missing.mo")]
    with pytest.raises(DataError, match="cut.mo"):
        read_catalog(tmp_path / "cut.mo")
