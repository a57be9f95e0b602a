"""The merchant portal in French, as the app ships it (webhook_receiver/locale/fr): the
catalog holds a translation of every msgid of the portal (its pages, forms, guard and
capability labels), compiled; every page, asked for in French as a browser asks
(``Accept-Language: fr``, read by LocaleMiddleware), is French, with none of the portal's
English words left in it; and a request that asks for no language, or for one the app
does not ship, still gets English."""

from __future__ import annotations

import ast
import gettext
import html
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation

import webhook_receiver
from tests.support.outbox import destination, failed
from webhook_receiver.models import RecoveryJob
from webhook_receiver.portal.access import portal_session_open
from webhook_receiver.portal.guard import COOKIE

MESSAGES = Path(webhook_receiver.__file__).parent / "locale" / "fr" / "LC_MESSAGES"
# where a msgid of the portal is used (the references makemessages writes, from the app's
# directory)
PORTAL = ("portal/", "templates/webhook_receiver/portal/")
EVERYTHING = ["recover", "manage_endpoints", "view_secret", "manage_secret"]
PLACEHOLDER = re.compile(r"%\(\w+\)\d*[sdg]")
# markup a msgid may hold (not "data.<field>", which is text)
TAG = re.compile(r"</?(?:a|b|br|code|em|i|kbd|span|strong)\b[^>]*>")


# --- the catalog -----------------------------------------------------------------------


@dataclass
class Entry:
    msgid: str
    plural: str | None
    msgstr: list[str]
    references: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    @property
    def of_the_portal(self) -> bool:
        return any(ref.startswith(PORTAL) for ref in self.references)


def _unquoted(lines: list[str]) -> str:
    return "".join(ast.literal_eval(line) for line in lines)


def po_entries() -> list[Entry]:
    """The .po's entries (its header and obsolete ``#~`` ones left out)."""
    entries = []
    for block in (MESSAGES / "django.po").read_text(encoding="utf-8").split("\n\n"):
        fields: dict[str, list[str]] = {}
        references: list[str] = []
        flags: list[str] = []
        current = None
        for line in block.strip().splitlines():
            if line.startswith("#:"):
                references += line[2:].split()
            elif line.startswith("#,"):
                flags += [flag.strip() for flag in line[2:].split(",")]
            elif line.startswith("#"):
                continue
            elif line.startswith('"'):
                fields[current].append(line)  # type: ignore[index]
            else:
                current, _, value = line.partition(" ")
                fields[current] = [value]
        if "msgid" not in fields or not _unquoted(fields["msgid"]):
            continue
        strings = sorted(key for key in fields if key.startswith("msgstr"))
        entries.append(
            Entry(
                _unquoted(fields["msgid"]),
                _unquoted(fields["msgid_plural"]) if "msgid_plural" in fields else None,
                [_unquoted(fields[key]) for key in strings],
                references,
                flags,
            )
        )
    return entries


PORTAL_ENTRIES = [entry for entry in po_entries() if entry.of_the_portal]


def test_the_catalog_translates_every_msgid_of_the_portal():
    assert len(PORTAL_ENTRIES) > 250  # the portal's pages, forms, guard and labels

    untranslated = [e.msgid for e in PORTAL_ENTRIES if not all(s.strip() for s in e.msgstr)]
    fuzzy = [e.msgid for e in PORTAL_ENTRIES if "fuzzy" in e.flags]

    assert untranslated == [], "run makemessages -l fr and translate these"
    assert fuzzy == [], "fuzzy entries are not compiled: check them, then drop the flag"
    for entry in PORTAL_ENTRIES:
        assert len(entry.msgstr) == (2 if entry.plural else 1), entry.msgid


def test_each_translation_keeps_its_msgids_placeholders_and_markup():
    for entry in PORTAL_ENTRIES:
        for number, text in enumerate(entry.msgstr):
            source = entry.plural if entry.plural and number else entry.msgid
            assert sorted(PLACEHOLDER.findall(text)) == sorted(PLACEHOLDER.findall(source)), (
                entry.msgid,
                text,
            )
            assert TAG.findall(text) == TAG.findall(source), (entry.msgid, text)


def test_the_compiled_catalog_is_the_po_compiled():
    """The .mo (what Django reads) answers each msgid with the .po's translation: it was
    compiled after the last edit (compilemessages, from webhook_receiver/)."""
    with open(MESSAGES / "django.mo", "rb") as mo:
        compiled = gettext.GNUTranslations(mo)

    assert compiled.info()["language"] == "fr"
    for entry in PORTAL_ENTRIES:
        if entry.plural is None:
            assert compiled.gettext(entry.msgid) == entry.msgstr[0], entry.msgid
        else:
            assert compiled.ngettext(entry.msgid, entry.plural, 1) == entry.msgstr[0]
            assert compiled.ngettext(entry.msgid, entry.plural, 2) == entry.msgstr[1]


def test_what_a_french_request_reads_is_the_apps_own_translation():
    """Django merges every installed app's catalog, an app listed earlier in
    INSTALLED_APPS winning a msgid they share (rest_framework's French says "Clef" for
    "Key"): each of the portal's words, as the project reads it in French, is the app's."""
    with translation.override("fr"):
        for entry in PORTAL_ENTRIES:
            if entry.plural is None:
                assert translation.gettext(entry.msgid) == entry.msgstr[0], entry.msgid
            else:
                assert translation.ngettext(entry.msgid, entry.plural, 1) == entry.msgstr[0]
                assert translation.ngettext(entry.msgid, entry.plural, 2) == entry.msgstr[1]


# --- the pages -------------------------------------------------------------------------


def english_left(page: str) -> list[str]:
    """The portal's English words (a msgid's fragment of three words or more between its
    placeholders and tags, whose translation differs) that a page still shows."""
    text = html.unescape(page)
    left = []
    for entry in PORTAL_ENTRIES:
        for source, translated in zip(
            [entry.msgid, entry.plural or entry.msgid], entry.msgstr, strict=False
        ):
            if source == translated:
                continue
            for fragment in re.split(f"{PLACEHOLDER.pattern}|{TAG.pattern}", source):
                fragment = fragment.strip(" .:;,()")
                if len(fragment.split()) >= 3 and fragment in text:
                    left.append(fragment)
    return left


@pytest.fixture(autouse=True)
def _english_afterwards():
    """LocaleMiddleware activates the request's language in this thread and leaves it:
    the tests that follow start in the default language again."""
    yield
    translation.deactivate()


@pytest.fixture
def portal(db):
    """Acme's session with every capability, its endpoint (failing: one failed message)
    and a recovery job of it, started through the portal."""
    dest = destination("acme-shop", tenant="acme")
    lost = failed(dest, "k-1", last_attempt_at=timezone.now())
    _, key = portal_session_open("acme", EVERYTHING, by="t")
    client = Client()
    client.cookies[COOKIE] = key
    since = timezone.localtime(timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    started = client.post(
        reverse("webhook_portal:endpoint_recover", args=[dest.pk]),
        {"kind": "recover", "since": since, "start": "1"},
    )
    assert started.status_code == 302, started.content[:2000]
    return client, dest, lost, RecoveryJob.objects.get()


def url(name: str, *args) -> str:
    return reverse(f"webhook_portal:{name}", args=args)


def french(client: Client, path: str, status: int = 200) -> str:
    answer = client.get(path, HTTP_ACCEPT_LANGUAGE="fr")
    assert answer.status_code == status, answer.content[:2000]
    assert answer["Content-Language"] == "fr"
    page = answer.content.decode()
    assert '<html lang="fr">' in page
    assert english_left(page) == [], path
    return page


# each page: its route, its arguments (endpoint, message, job), and words it says in French
PAGES = [
    (
        "endpoints",
        lambda d, m, j: (),
        ["Points de terminaison", "Ajouter un point de terminaison", "Disjoncteur", "jamais"],
    ),
    (
        "endpoint",
        lambda d, m, j: (d.pk,),
        ["Santé", "Échecs consécutifs", "Abonnements", "Horizon de rejeu", "Secret et clefs"],
    ),
    (
        "endpoint_add",
        lambda d, m, j: (),
        ["Types d’événements", "Filtre (JSON)", "Ajouter le point de terminaison", "Annuler"],
    ),
    (
        "endpoint_edit",
        lambda d, m, j: (d.pk,),
        ["Modifier acme-shop", "Là où les webhooks sont envoyés", "Enregistrer"],
    ),
    (
        "endpoint_secret",
        lambda d, m, j: (d.pk,),
        [
            "Secret et clefs de acme-shop",
            "2 secrets signent chaque requête",
            "L’ancien secret continue de signer pendant",
            "24 heures",
        ],
    ),
    (
        "endpoint_test",
        lambda d, m, j: (d.pk,),
        ["Envoyer un événement de test à acme-shop", "Envoyer l’événement de test"],
    ),
    (
        "endpoint_recover",
        lambda d, m, j: (d.pk,),
        ["Récupérer les messages de acme-shop", "Messages à renvoyer", "Planifier"],
    ),
    (
        "messages",
        lambda d, m, j: (),
        ["Filtrer les messages", "Admis depuis", "En échec", "Relancer la sélection"],
    ),
    (
        "message",
        lambda d, m, j: (m.pk,),
        ["Le message", "Clef d’ordonnancement", "Charge utile", "Relancer maintenant"],
    ),
    (
        "recovery_jobs",
        lambda d, m, j: (),
        ["Tâches de récupération", "Progression", "Récupérer les messages en échec"],
    ),
    (
        "recovery_job",
        lambda d, m, j: (j.pk,),
        ["Récupération #", "Annuler la tâche", "Types d’événements demandés"],
    ),
    (
        "catalog",
        lambda d, m, j: (),
        ["Catalogue des événements", "Groupes", "Exemple", "Schéma"],
    ),
]


@pytest.mark.parametrize("name, args, words", PAGES, ids=[p[0] for p in PAGES])
def test_each_page_asked_for_in_french_is_french(portal, name, args, words):
    client, dest, lost, job = portal

    page = french(client, url(name, *args(dest, lost, job)))

    for word in words:
        assert word in page, (name, word)
    # the navigation and the header, on every page
    for word in ("Aller au contenu", "Se déconnecter", "Catalogue des événements"):
        assert word in page, (name, word)


def test_a_note_after_an_action_is_french(portal):
    client, dest, _lost, job = portal

    started = french(client, url("recovery_job", job.pk) + "?note=started")
    disabled = client.post(url("endpoint_disable", dest.pk), HTTP_ACCEPT_LANGUAGE="fr")
    noted = french(client, disabled["Location"])

    assert "Lancée : le relais envoie ses messages à son débit" in started
    assert "Désactivé : plus rien ne lui est envoyé" in noted


def test_the_refusal_without_a_session_is_french(db):
    page = french(Client(), url("endpoints"), status=403)

    assert "Votre session du portail a pris fin ou n’a jamais été ouverte" in page


def test_the_refusal_of_a_missing_capability_names_it_in_french(db):
    _, key = portal_session_open("acme", ["recover"], by="t")
    client = Client()
    client.cookies[COOKIE] = key

    page = french(client, url("endpoint_add"), status=403)

    assert "Permission requise : ajouter, modifier, désactiver et activer" in page


@pytest.mark.parametrize("asked", [None, "en", "de"])
def test_a_request_that_asks_for_no_language_or_another_one_gets_english(portal, asked):
    client, dest, _lost, _job = portal
    headers = {} if asked is None else {"HTTP_ACCEPT_LANGUAGE": asked}

    answer = client.get(url("endpoint", dest.pk), **headers)

    page = answer.content.decode()
    assert answer.status_code == 200
    assert '<html lang="en' in page
    assert "Consecutive failures" in page and "Échecs consécutifs" not in page
