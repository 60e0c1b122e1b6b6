"""The PII filter (agents/pii): detectors with validation, placeholders, settings, and a
property test that generated PII inside realistic actions never survives it."""

from __future__ import annotations

import base64
import json
import random
import string
from typing import Any

import phonenumbers
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.accumulate.state import Limits, MemoryBatchStore, apply_payload
from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from agents.pii import FIELD_POLICY, PLACEHOLDER, PiiFilter, build_pii_filter, detectors
from agents.pii.presidio import presidio_detectors
from agents.summarize.state import SummaryState, count_facts
from agents.summarizer import build_prompt, default_format_actions
from schemas import ActionsPayload, SummarizeRequest, decode
from schemas.fast import payload_struct
from schemas.ledger import LedgerLimits
from streams.observe import metrics
from streams.settings import ConfigurationError, Settings, from_environment

KEY = b"test-key-not-a-secret-0123456789"


@pytest.fixture
def pii() -> PiiFilter:
    return PiiFilter(key=KEY)


def kinds(text: str) -> list[str]:
    return [m.group(0)[1:].rsplit("_", 1)[0] for m in PLACEHOLDER.finditer(text)]


@pytest.mark.parametrize(
    ("text", "kind", "secret"),
    [
        ("Changed email to Jane.Doe+work@Example.co.uk today", "EMAIL", "Jane.Doe+work@"),
        ("Called (415) 555-0132 for support", "PHONE", "555-0132"),
        ("Dialled +44 20 7946 0958.", "PHONE", "7946 0958"),
        ("Paid with 4111 1111 1111 1111", "CARD", "1111 1111"),
        ("card 5500-0000-0000-0004 declined", "CARD", "5500-0000"),
        ("IBAN DE89 3704 0044 0532 0130 00 saved", "IBAN", "0532 0130"),
        ("iban GB82WEST12345698765432", "IBAN", "GB82WEST"),
        ("login from 203.0.113.42", "IP", "203.0.113.42"),
        ("login from 2001:db8:85a3::8a2e:370:7334 blocked", "IP", "8a2e:370:7334"),
        ("SSN 123-45-6789 entered", "SSN", "123-45-6789"),
        ("Authorization: Bearer abcDEF1234567890xyzXYZ", "SECRET", "abcDEF1234567890"),
        ("pasted sk-proj-AbCdEfGhIjKlMnOpQrStUvWx12", "SECRET", "AbCdEfGhIj"),
        ("AWS AKIAIOSFODNN7EXAMPLE", "SECRET", "IOSFODNN7"),
        ("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlX2hlcmU", "SECRET", "eyJzdWIi"),
        ("set password=hunter2hunter", "SECRET", "hunter2"),
        ("https://app.example.com/cb?code=x1y2z3&state=ok", "TOKEN", "x1y2z3"),
        ("https://app.example.com/r?session_id=abc987&page=2", "TOKEN", "abc987"),
        ("https://app.example.com/u?to=ann%40corp.io", "EMAIL", "ann%40corp.io"),
        # a redirect's own query, encoded or not: the values under sensitive names too
        ("https://a.io/in?next=https%3A%2F%2Fa.io%2Fcb%3Fcode%3Dq1w2e3", "TOKEN", "q1w2e3"),
        ("https://app.example.com/in?next=/cb?state=1&access_token=z9y8x7w6", "TOKEN", "z9y8x7w6"),
        ("https://app.example.com/in?return_to=/cb%3Fsid%3Dk4j5h6", "TOKEN", "k4j5h6"),
    ],
)
def test_detectors_find_and_replace(pii: PiiFilter, text: str, kind: str, secret: str) -> None:
    redacted = pii.redact_text(text, "s1")
    assert secret not in redacted
    assert kind in kinds(redacted), redacted


@pytest.mark.parametrize(
    "text",
    [
        "Paid with 4111 1111 1111 1112",  # Luhn fails
        "IBAN DE89 3704 0044 0532 0130 01",  # checksum fails
        "order 1234567 shipped",
        "version 1.2.300.4 and 999.1.1.1",
        "Meeting at 12:30:45 on 2024-05-06",
        "Clicked Reset password button",
        "https://app.example.com/projects/123/tasks?tab=billing&sort=date",
        "Searched help for 'export limits'",
        # a UUID whose first groups are all digits and pass Luhn: was a <CARD_…>
        "https://app.example.com/docs/49163640-3753-3606-cff1-6af0322dbfb2/edit",
    ],
)
def test_validation_leaves_lookalikes_alone(pii: PiiFilter, text: str) -> None:
    assert pii.redact_text(text, "s1") == text


def test_placeholders_are_stable_in_a_session_and_differ_across_sessions(pii: PiiFilter) -> None:
    first = pii.redact_text("mail bob@x.io", "s1")
    again = pii.redact_text("BOB@X.IO wrote again", "s1")  # same value, other spelling
    other = pii.redact_text("mail bob@x.io", "s2")
    assert PLACEHOLDER.search(first) and first.split()[1] == again.split()[0]
    assert first != other
    assert pii.redact_text("mail carol@x.io", "s1") != first
    # Keyed: another deployment key gives other tags; redacting twice changes nothing.
    assert PiiFilter(key=b"another-key-0123456789").redact_text("mail bob@x.io", "s1") != first
    assert pii.redact_text(first, "s1") == first


def test_payload_fields_per_policy(pii: PiiFilter) -> None:
    payload = ActionsPayload.model_validate(
        {
            "session_id": "s1",
            "user_id": "dana@corp.io",
            "email": "dana@corp.io",
            "actions": [
                {
                    "type": "input",
                    "title": "Typed dana@corp.io",
                    "description": "Entered phone (415) 555-0132",
                    "canonical_url": "https://a.example.com/reset",
                    "raw_url": "https://a.example.com/reset?token=zz9",
                }
            ],
        }
    )
    (out,) = pii.redact([payload], "s1")
    action = out.actions[0]
    assert out.email == out.user_id == action.title.split()[1]  # one person, one placeholder
    assert "555-0132" not in action.description and "zz9" not in action.raw_url
    assert action.canonical_url == "https://a.example.com/reset"
    assert payload.email == "dana@corp.io"  # the input is not modified


def test_the_prompt_gets_placeholders_and_detections_are_counted(pii: PiiFilter) -> None:
    before = metrics.PII_DETECTIONS.labels("CARD")._value.get()
    payload = ActionsPayload.model_validate(
        {
            "session_id": "s1",
            "actions": [{"type": "submit", "description": "card 4111111111111111"}],
        }
    )
    prompt = build_prompt("{actions}", None, pii.redact([payload], "s1"), default_format_actions)
    assert "4111111111111111" not in prompt and "<CARD_" in prompt
    assert metrics.PII_DETECTIONS.labels("CARD")._value.get() == before + 1


def test_destinations_filter_the_accumulator_context_and_ledger(pii: PiiFilter) -> None:
    payload = ActionsPayload.model_validate(
        {
            "session_id": "s1",
            "actions": [{"type": "error", "description": "failed for x@y.io", "raw_url": "/a"}],
        }
    )
    limits = Limits(threshold=1, max_actions_per_batch=10, pii=pii)
    _, out = apply_payload(
        None, payload_struct(payload), 0, limits, now=1.0, store=MemoryBatchStore()
    )
    assert out and all(b"x@y.io" not in e.value for e in out)
    assert any(b"<EMAIL_" in e.value for e in out)
    # The ledger is counted from the request's (filtered) batches at the summarize stage.
    (request,) = [decode(SummarizeRequest, e.value) for e in out if e.topic == "summarize"]
    facts = SummaryState(generation=0)
    count_facts(facts, request, LedgerLimits())
    assert facts.ledger is not None and facts.ledger["errors_total"] == 1
    assert "x@y.io" not in json.dumps(facts.ledger) and "<EMAIL_" in json.dumps(facts.ledger)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AC_PII": "destinations"}, "invalid setting AC_PII: 'destinations': must be llm"),
        ({"AC_PII_KEY": "short"}, "invalid setting AC_PII_KEY: must be at least 16"),
        ({"AC_PII_PATTERNS": "lower=x"}, "invalid setting AC_PII_PATTERNS: 'lower=x' is not"),
        ({"AC_PII_PATTERNS": "ORDER=("}, "invalid setting AC_PII_PATTERNS: ORDER: not a regular"),
        ({"AC_PII_PHONE_REGION": "XX"}, "invalid setting AC_PII_PHONE_REGION: 'XX' is not"),
    ],
)
def test_settings_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as exc:
        from_environment(Settings)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_settings_build_the_filter_with_custom_patterns() -> None:
    assert build_pii_filter(Settings(pii="off")) is None
    assert Settings(pii=" destinations , llm").pii == "llm,destinations"
    custom = Settings(
        pii="llm,destinations", pii_key="k" * 16, pii_patterns=r"ORDER=ORD-\d{6};X=a;b"
    )
    pii = build_pii_filter(custom)
    assert pii is not None and pii.destinations
    assert kinds(pii.redact_text("order ORD-123456 shipped", "s")) == ["ORDER"]
    assert [n for n, _ in custom.pii_pattern_list()] == ["ORDER", "X"]  # "a;b" is X's regex


def test_presidio_detectors_with_an_injected_analyzer() -> None:
    class Result:
        def __init__(self, start: int, end: int) -> None:
            self.start, self.end, self.score = start, end, 0.9

    class Analyzer:
        def analyze(self, text: str, entities: list[str], language: str) -> list[Result]:
            word = {"PERSON": "Ada Lovelace", "LOCATION": "12 Baker Street"}[entities[0]]
            at = text.find(word)
            return [Result(at, at + len(word))] if at >= 0 else []

    pii = PiiFilter(key=KEY, detectors=presidio_detectors(Analyzer()))
    out = pii.redact_text("Ada Lovelace moved to 12 Baker Street", "s")
    assert kinds(out) == ["PERSON", "ADDRESS"]


# --- property test: generated PII inside realistic action text -------------------------

_ALNUM = string.ascii_letters + string.digits


def _luhn_complete(prefix: str, length: int, rng: random.Random) -> str:
    body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    for check in string.digits:
        digits = body + check
        total = sum(
            (d * 2 - 9 if d * 2 > 9 else d * 2) if i % 2 else d
            for i, d in enumerate(int(c) for c in reversed(digits))
        )
        if total % 10 == 0:
            return digits
    raise AssertionError("unreachable")


def _iban(country: str, bban: str) -> str:
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    return f"{country}{98 - int(numeric) % 97:02d}{bban}"


@st.composite
def pii_values(draw: st.DrawFn) -> tuple[str, str]:
    """(kind, the PII exactly as written into the text)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    kind = draw(st.sampled_from(["EMAIL", "PHONE", "CARD", "IBAN", "IP", "SSN", "SECRET"]))
    if kind == "EMAIL":
        return kind, draw(st.emails())
    if kind == "PHONE":
        region = rng.choice(["US", "US", "GB", "DE", "FR"])
        while True:
            example = phonenumbers.example_number(region)
            assert example is not None
            national = str(example.national_number)
            example.national_number = int(
                national[:3] + "".join(rng.choices("0123456789", k=len(national) - 3))
            )
            if phonenumbers.is_valid_number(example):
                break
        fmt = phonenumbers.PhoneNumberFormat
        formats = [fmt.E164, fmt.INTERNATIONAL] + ([fmt.NATIONAL] if region == "US" else [])
        return kind, phonenumbers.format_number(example, rng.choice(formats))
    if kind == "CARD":
        prefix, length = rng.choice([("4", 16), ("51", 16), ("37", 15), ("6011", 16), ("4", 19)])
        digits = _luhn_complete(prefix, length, rng)
        sep = rng.choice(["", " ", "-"])
        return kind, sep.join(digits[i : i + 4] for i in range(0, len(digits), 4))
    if kind == "IBAN":
        country, bban = rng.choice(
            [
                ("DE", "".join(rng.choices(string.digits, k=18))),
                (
                    "GB",
                    "".join(rng.choices(string.ascii_uppercase, k=4))
                    + "".join(rng.choices(string.digits, k=14)),
                ),
                ("FR", "".join(rng.choices(string.digits, k=23))),
                (
                    "NL",
                    "".join(rng.choices(string.ascii_uppercase, k=4))
                    + "".join(rng.choices(string.digits, k=10)),
                ),
            ]
        )
        iban = _iban(country, bban)
        return kind, rng.choice([iban, " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))])
    if kind == "IP":
        v6 = st.ip_addresses(v=6).filter(lambda a: a.is_global)
        return kind, str(draw(st.one_of(st.ip_addresses(v=4), v6)))
    if kind == "SSN":
        area = rng.choice([n for n in range(1, 900) if n != 666])
        return kind, f"{area:03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"
    token = "".join(rng.choices(_ALNUM, k=rng.randint(24, 40)))
    header = base64.urlsafe_b64encode(b'{"alg":"HS256"}').decode().rstrip("=")
    claims = base64.urlsafe_b64encode(json.dumps({"sub": token}).encode()).decode().rstrip("=")
    return kind, rng.choice(
        [
            f"sk-{token}",
            f"sk_live_{token}",
            f"ghp_{token}{token}"[:40],
            f"AKIA{''.join(rng.choices(string.ascii_uppercase + string.digits, k=16))}",
            f"{header}.{claims}.{token}",
            f"Bearer {token}",
        ]
    )


TEMPLATES = [
    "Updated contact details to {pii}",
    "Entered {pii} in the form",
    "Saw error 'invalid value: {pii}'",
    "Copied ({pii}) to clipboard",
    'Searched for "{pii}".',
    "{pii}",
]
QUERY_NAMES = ["token", "access_token", "api_key", "email", "password", "session", "sid", "auth"]


@st.composite
def actions_with_pii(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    _kind, value = draw(pii_values())
    rng = random.Random(draw(st.integers(0, 2**32)))
    secret = "".join(rng.choices(_ALNUM + "-_.", k=rng.randint(6, 30)))
    name = rng.choice(QUERY_NAMES)
    url = f"https://app.example.com/settings/team?tab=members&{name}={secret}"
    field = rng.choice(["title", "description"])
    action = {
        "type": "input",
        field: rng.choice(TEMPLATES).format(pii=value),
        "canonical_url": "https://app.example.com/settings/team",
        "raw_url": url,
    }
    return action, [value, f"{name}={secret}"]


def test_generated_pii_never_survives_the_filter_10000_actions(pii: PiiFilter) -> None:
    seen = {"actions": 0}

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(actions_with_pii(), min_size=20, max_size=20), st.text(_ALNUM, min_size=1))
    def check(batch: list[tuple[dict[str, Any], list[str]]], session: str) -> None:
        payload = ActionsPayload.model_validate(
            {"session_id": session, "actions": [a for a, _ in batch]}
        )
        (out,) = pii.redact([payload], session)
        text = out.model_dump_json()
        for action, secrets in zip(out.actions, (s for _, s in batch), strict=True):
            fields = f"{action.title} {action.description} {action.raw_url}"
            for secret in secrets:
                assert secret not in fields, (secret, fields)
        assert PLACEHOLDER.search(text)
        seen["actions"] += len(batch)

    check()
    assert seen["actions"] >= 10_000


def test_ordinary_saas_text_is_unchanged(pii: PiiFilter) -> None:
    plans = plan_sessions(300, mean_length=40, seed=3)
    total = unchanged = 0
    for raw in interleaved_payloads(plans, seed=3):
        payload = ActionsPayload.model_validate(raw)
        (out,) = pii.redact([payload], payload.session_id)
        for before, after in zip(payload.actions, out.actions, strict=True):
            total += 1
            fields = ("title", "description", "canonical_url", "raw_url", "type")
            unchanged += all(getattr(before, f) == getattr(after, f) for f in fields)
    assert total >= 10_000
    assert unchanged / total >= 0.99, f"{total - unchanged} of {total} actions changed"


# --- the fast path (cache, `in` gates, early exits) against the plain one ---------------

_FAST = PiiFilter(key=KEY)  # shared across examples, so cached results are compared too
_PLAIN = PiiFilter(key=KEY, _cache=0)


def _plain(monkeypatch: pytest.MonkeyPatch, call: Any) -> Any:
    with monkeypatch.context() as m:
        m.setattr(detectors, "_GATED", False)
        return call()


# What the detectors' gates look for, in the case variants (?i) matches: ſ (s), K (k),
# ı and İ (i) are folded by re but not by str.lower(), so non-ASCII text skips those gates.
_GATE_WORDS = [
    *("password=", "PAſſWORD: hunter22", "baſic dXNlcjpwYXNz", "AUTHORİZATİON: 0penSesame"),
    *("Bearer ", "ıd_token=", "token:", "cLıent_ſecret=abcd1234 "),
    *("api-key=", "sk-", "ghp_", "xoxb-", "AKIA", "AIza", "SG.", "eyJ", "glpat-"),
    *("DE", "GB", "1.2.", "::", "ext. ", " x ", "#", ";ext=", "+", "011", "(", ")", "555"),
]


@st.composite
def field_texts(draw: st.DrawFn) -> str:
    _kind, value = draw(pii_values())
    noise = draw(
        st.lists(
            st.one_of(
                st.text(alphabet=_ALNUM + " @.:-=?&%/_+<>", max_size=12),
                st.sampled_from(_GATE_WORDS),
            ),
            max_size=6,
        ).map("".join)
    )
    template = draw(
        st.sampled_from([*TEMPLATES, "{pii} {noise}", "https://a.io/x?q={pii}&n={noise}"])
    )
    return template.format(pii=value, noise=noise) if draw(st.booleans()) else noise


def test_fast_path_is_exact_on_generated_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        field_texts(),
        st.sampled_from(["s1", "s2"]),
        st.sampled_from(list(set(FIELD_POLICY.values()))),
    )
    def check(text: str, session: str, policy: str) -> None:
        for _ in range(2):  # the second call is served from the cache
            fast = _FAST.redact_text(text, session, policy)
            assert fast == _plain(monkeypatch, lambda: _PLAIN.redact_text(text, session, policy))

    check()


def test_fast_path_is_exact_on_synthetic_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    payloads = [
        ActionsPayload.model_validate(raw)
        for raw in interleaved_payloads(plan_sessions(40, mean_length=20, seed=5), seed=5)
    ]
    fast = [_FAST.redact([p], p.session_id)[0] for p in payloads]
    plain = _plain(monkeypatch, lambda: [_PLAIN.redact([p], p.session_id)[0] for p in payloads])
    assert fast == plain


def _copied_always(f: PiiFilter, payload: ActionsPayload, session: str) -> ActionsPayload:
    """The oracle: 873a9aa's ``_payload``, which copied every payload."""
    actions = []
    for action in payload.actions:
        update = f._fields(action, tuple(FIELD_POLICY), session)
        actions.append(action.model_copy(update=update) if update else action)
    changes: dict[str, object] = {"actions": actions}
    changes.update(f._fields(payload, ("user_id", "email"), session))
    return payload.model_copy(update=changes)


@pytest.mark.parametrize(
    ("payload_fields", "description"),
    [
        ({}, "Clicked save"),  # nothing to filter: the very payload comes back
        ({}, "Mailed dana@corp.io"),
        ({"email": "dana@corp.io"}, "Clicked save"),
        ({"user_id": "u-1"}, "Called (415) 555-0132"),
    ],
)
def test_redact_returns_what_copying_every_payload_did(
    pii: PiiFilter, payload_fields: dict[str, str], description: str
) -> None:
    payload = ActionsPayload.model_validate(
        {
            "session_id": "s1",
            **payload_fields,
            "actions": [{"title": "t", "description": description}, {"title": "plain"}],
        }
    )
    (out,) = pii.redact([payload], "s1")
    oracle = _copied_always(pii, payload, "s1")
    assert out == oracle and out.model_dump() == oracle.model_dump()
    assert (out is payload) == (out.model_dump() == payload.model_dump())


def _phone_texts() -> list[str]:
    """Every region's example numbers in every format, the shortest ones included (4-digit
    national numbers: +43 1234-style), inside prose and URLs, and URLs with ids of 3-12
    digits, UUIDs and dates."""
    fmt = phonenumbers.PhoneNumberFormat
    numbers = []
    for region in sorted(phonenumbers.SUPPORTED_REGIONS):
        for kind in (phonenumbers.PhoneNumberType.FIXED_LINE, phonenumbers.PhoneNumberType.MOBILE):
            example = phonenumbers.example_number_for_type(region, kind)
            if example is not None:
                numbers += [
                    phonenumbers.format_number(example, f)
                    for f in (fmt.E164, fmt.INTERNATIONAL, fmt.NATIONAL)
                ]
                numbers += [  # dialled from abroad: 011 44 ..., 00 1 ...
                    phonenumbers.format_out_of_country_calling_number(example, origin)
                    for origin in ("US", "GB", "AT", "JP")
                ]
    rng = random.Random(11)
    templates = ("Called {} twice", "https://a.io/call/{}?x=1", "Call {} ext. 12", "{};ext=9")
    texts = [t.format(n) for n in numbers for t in (*templates, "Rufen Sie {} an – danke")]
    for digits in range(3, 13):
        ident = "".join(rng.choices(string.digits, k=digits))
        texts += [
            f"https://app.example.com/orders/{ident}/items/{rng.randrange(100)}?page=2",
            f"Opened order {ident} on 2026-12-03",
            f"/projects/{ident}-{ident[::-1]}/edit",
        ]
    texts += [
        f"https://app.example.com/t/{random.Random(i).randbytes(16).hex()}/edit" for i in range(50)
    ]
    return texts


def test_phones_digit_runs_hold_every_candidate() -> None:
    """In ASCII text the gate counts the digits between characters libphonenumber's candidate
    pattern cannot match: each candidate's digits lie inside one such run."""

    @settings(max_examples=600, deadline=None)
    @given(
        st.lists(
            st.one_of(
                st.text(alphabet=string.printable, max_size=10),
                st.text(alphabet=string.digits + " -.()/+x#", min_size=4, max_size=14),
                st.sampled_from(["ext. ", "EXT", " x ", ";ext=", "int", "anexo", "#", "+", "~"]),
            ),
            max_size=8,
        ).map("".join)
    )
    def check(text: str) -> None:
        runs = detectors._digit_runs(text)
        for m in detectors._CANDIDATES.finditer(text):  # type: ignore[union-attr]
            digits = "".join(filter(str.isdigit, m.group())).encode()
            assert any(digits in run for run in runs), (m.group(), runs)

    check()


@pytest.mark.parametrize("region", ["US", "AT", "GB", "NU", "JP"])
def test_phones_gate_is_exact(region: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The matcher is skipped only where it finds nothing: gated and plain agree on every
    region's example numbers, the shortest included, and on URLs with ids."""
    phones = detectors.Phones(region)
    texts = _phone_texts()
    gated = [list(phones(t)) for t in texts]
    plain = _plain(monkeypatch, lambda: [list(phones(t)) for t in texts])
    assert gated == plain
    assert sum(map(bool, plain)) > len(texts) // 3  # numbers were found, not all skipped
    skipped = sum(1 for t in texts if not phones._may_hold_one(t))
    # And the gate skips some (URLs with short ids, UUIDs) where numbers need 6 digits;
    # a region with 4-digit national numbers (AT, NU) runs the matcher on more.
    assert skipped >= (20 if phones.fewest_digits >= 6 else 1)


def test_phones_gate_uses_libphonenumber_s_own_candidates() -> None:
    """A private name of phonenumbers (pinned >=8.13): without it only the digit count
    gates the matcher, exact but slower."""
    assert detectors._CANDIDATES is not None
    phones = detectors.Phones("US")
    assert phones.fewest_digits == 6  # +NN and a 4-digit national number
    assert phones.fewest_without_plus == 9  # 011, then that: 10-digit US numbers are longer
    assert phones.fewest_national == 10  # without 011 in it: a US number
    assert not phones._may_hold_one("https://app.example.com/orders/123456789")
    assert phones._may_hold_one("call 011 43 1234")  # dialled out: parsed as +43 1234


def test_phones_gate_without_libphonenumber_s_pattern_is_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the private pattern is gone (another phonenumbers), neither the candidates nor
    the characters they are made of are known: the text's digit count alone gates."""
    phones = detectors.Phones("US")
    texts = _phone_texts()
    plain = _plain(monkeypatch, lambda: [list(phones(t)) for t in texts])
    monkeypatch.setattr(detectors, "_CANDIDATES", None)
    assert [list(phones(t)) for t in texts] == plain
    assert not phones._may_hold_one("https://app.example.com/orders/123456789")  # 9 digits
