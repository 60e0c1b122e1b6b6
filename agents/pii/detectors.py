"""PII detectors: a candidate regex, then a validation that a bare regex cannot do.

Each detector returns ``(start, end, canonical value)`` spans of one text; the
canonical value (an email lower-cased, a phone in E.164, a card's digits) is what
the placeholder is derived from, so one value written two ways gets one placeholder.
"""

from __future__ import annotations

import ipaddress
import re
import string
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from itertools import product

import phonenumbers
import phonenumbers.phonenumbermatcher
from phonenumbers import PhoneMetadata

from schemas.text import holds_any

__all__ = ["BUILT_IN", "Detector", "Span", "regex_detector"]

Span = tuple[int, int, str]
# Built-ins return lists (an empty one costs a third of an exhausted generator's call);
# a custom detector may yield its spans.
Detector = Callable[[str], Iterable[Span]]
# The `in` checks below skip scans that cannot match; False runs every scan, for
# test_fast_path_is_exact_* which compares both paths.
_GATED = True

# Every character RFC 5322 allows in a local part: "/users/ann@x.io" in a path is
# redacted whole, the price of never leaving "ann/b" of "ann/b@x.io" behind.
_EMAIL = re.compile(
    r"(?<![\w.+-])[\w!#$%&'*+/=?^`{|}~-]+(?:\.[\w!#$%&'*+/=?^`{|}~-]+)*"
    r"@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+(?:[A-Za-z]{2,63}|xn--[A-Za-z0-9-]+))\b"
)


def emails(text: str) -> list[Span]:
    if _GATED and "@" not in text:  # a character every match holds: `in` beats the scan
        return []
    found: list[Span] = []
    for m in _EMAIL.finditer(text):
        local = m.group(0)[: m.start(1) - m.start() - 1]
        if len(local) <= 64 and len(m.group(0)) <= 254:
            found.append((m.start(), m.end(), m.group(0).lower()))
    return found


# Long enough to be a payment card; separators are single spaces or dashes.
# Not glued by a dash to more of a token: a UUID whose first groups are all digits
# ("49163640-3753-3606-cff1-...") is no card (test_pii.py::test_validation_leaves_lookalikes_alone).
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?!\d|-\w)")
_CARD_PREFIX = re.compile(r"^(?:4|5[1-5]|2[2-7]|3[47]|3[0689]|6(?:011|5|4[4-9]|2)|35)")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _digit_count(text: str) -> int:
    if text.isascii():  # 0.3 µs a URL against 1.5 for the general count below
        return len(text) - len(text.encode().translate(None, b"0123456789"))
    return sum(map(str.isdigit, text))  # isdigit holds for every \d (Unicode Nd) and more


def cards(text: str) -> list[Span]:
    if _GATED and _digit_count(text) < 13:
        return []
    found: list[Span] = []
    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group(0))
        if 13 <= len(digits) <= 19 and _CARD_PREFIX.match(digits) and _luhn(digits):
            found.append((m.start(), m.end(), digits))
    return found


# Lengths from the SWIFT IBAN registry: a country's length bounds the match, so the
# next word is never swallowed into an IBAN (which then fails its checksum).
_IBAN_LENGTHS = {
    c[:2]: int(c[2:])
    for c in (
        "AD24 AE23 AL28 AT20 AZ28 BA20 BE16 BG22 BH22 BR29 CH21 CR22 CY28 CZ24 DE22 DK18 DO28 "
        "EE20 EG29 ES24 FI18 FO18 FR27 GB22 GE22 GI23 GL18 GR27 GT28 HR21 HU28 IE22 IL23 IS26 "
        "IT27 JO30 KW30 KZ20 LB28 LI21 LT20 LU20 LV21 MC27 MD24 ME22 MK19 MR27 MT31 MU30 NL18 "
        "NO15 PK24 PL28 PS29 PT25 QA29 RO24 RS22 SA24 SE24 SI19 SK24 SM27 TN24 TR26 UA29 VG24 XK20"
    ).split()
}
_IBAN_START = re.compile(r"\b([A-Z]{2})\d{2}")
# ASCII capitals to "A", digits to "0", the rest to " ": in ASCII text (where \d is 0-9) a
# start is "AA00" there (0.5 µs against the pattern's scan, 0.6-1.8 µs a line of text).
_CAPITALS_DIGITS = bytes(65 if 65 <= c <= 90 else 48 if 48 <= c <= 57 else 32 for c in range(256))


def ibans(text: str) -> list[Span]:
    if _GATED and (
        text.lower() == text  # no capital letter: no A-Z to start one
        or (text.isascii() and b"AA00" not in text.encode().translate(_CAPITALS_DIGITS))
    ):
        return []
    found: list[Span] = []
    for m in _IBAN_START.finditer(text):
        length = _IBAN_LENGTHS.get(m.group(1))
        if length is None:
            continue
        chars: list[str] = []
        end = m.start()
        while end < len(text) and len(chars) < length:
            if text[end].isascii() and text[end].isalnum():
                chars.append(text[end].upper())
            elif not (text[end] == " " and chars and end + 1 < len(text) and text[end + 1] != " "):
                break
            end += 1
        if len(chars) < length or (end < len(text) and text[end].isalnum()):
            continue
        iban = "".join(chars)
        if int("".join(str(int(c, 36)) for c in iban[4:] + iban[:4])) % 97 == 1:
            found.append((m.start(), end, iban))
    return found


_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?!\.?\d)")
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|:)?(?![\w:])")


def ip_addresses(text: str) -> list[Span]:
    found: list[Span] = []
    ipv4, ipv6 = text.count(".") >= 3, text.count(":") >= 2  # a.b.c.d; a:b:c
    if _GATED and not (ipv4 or ipv6):
        return found
    for pattern, may_match in ((_IPV4, ipv4), (_IPV6, ipv6)):
        if _GATED and not may_match:
            continue
        for m in pattern.finditer(text):
            try:
                address = ipaddress.ip_address(m.group(0))
            except ValueError:
                continue
            if m.group(0) != "::":
                found.append((m.start(), m.end(), str(address)))
    return found


_SSN = re.compile(r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])")


def ssns(text: str) -> list[Span]:
    if _GATED and "-" not in text:
        return []
    return [(m.start(), m.end(), m.group(0)) for m in _SSN.finditer(text)]


_API_KEY = re.compile(
    r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|[spr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|A[KS]IA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{40,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[\w-]{35}|glpat-[\w-]{20,}|SG\.[\w-]{16,}\.[\w-]{16,})"
)
_JWT = re.compile(r"\beyJ[\w-]{4,}\.eyJ[\w-]{4,}\.[\w-]{8,}")
_BEARER = re.compile(r"(?i)\b(?:bearer|basic)\s+([\w.~+/-]{16,}=*)")
# "password: x", "api_key=x", "Authorization: Bearer x": the value after the separator.
_ASSIGNED = re.compile(
    r"(?i)\b(?:authorization|x-api-key|api[-_]?key|(?:access|refresh|auth|id)[-_]?token"
    r"|client[-_]?secret|secret|passw(?:or)?d|pwd|token)\s*[:=]\s*[\"']?"
    r"(?:(?:bearer|basic)\s+)?(?!<)([^\s\"'<>,;&]{4,})"
)


# A literal every match of a pattern holds, so a text without one skips its scan (12 µs
# a URL for the four). The case-blind words are checked on ASCII text only, where lower()
# is exact: (?i) also folds ſ, K, ı, İ (test_pii.py::test_fast_path_is_exact_*).
_KEY_LITERALS = ("sk-", "k_", "IA", "gh", "xox", "AIza", "glpat-", "SG.")
_BEARER_WORDS = ("bearer", "basic")
_ASSIGNED_WORDS = ("auth", "api", "token", "secret", "passw", "pwd")


def secrets(text: str) -> list[Span]:
    found: list[Span] = []
    low = text.lower() if _GATED and text.isascii() else None
    # Each gate asked only when its scan is next: most texts fail all four (1.5 against 0.9 µs).
    if not _GATED or "eyJ" in text:
        _scan(_JWT, 0, text, found)
    if not _GATED or holds_any(_KEY_LITERALS, text):
        _scan(_API_KEY, 0, text, found)
    if low is None or holds_any(_BEARER_WORDS, low):
        _scan(_BEARER, 1, text, found)
    if low is None or (("=" in low or ":" in low) and holds_any(_ASSIGNED_WORDS, low)):
        _scan(_ASSIGNED, 1, text, found)
    return found


def _scan(pattern: re.Pattern[str], group: int, text: str, found: list[Span]) -> None:
    for m in pattern.finditer(text):
        found.append((m.start(group), m.end(group), m.group(group)))


# libphonenumber's own candidate pattern (a private name: without it, only the digit count
# gates the matcher). A match is made inside one candidate, from its digits.
_CANDIDATES: re.Pattern[str] | None = getattr(phonenumbers.phonenumbermatcher, "_PATTERN", None)


# Every ASCII character besides digits that pattern can match (IGNORECASE): its punctuation
# and its extension words ("ext", "int", "anexo", "x"). In ASCII text the others split it,
# so the digits left between them hold every candidate's (test_phones_digit_runs_*).
_IN_CANDIDATES = b"aeinostxAEINOSTX()[]./~+;=:,\t# -"
_DIGITS_ONLY = bytes(c if 48 <= c <= 57 else 32 for c in range(256))


def _digit_runs(ascii_text: str) -> list[bytes]:
    """The digits of each stretch of the text that a candidate may span."""
    return ascii_text.encode().translate(_DIGITS_ONLY, _IN_CANDIDATES).split()


def _shortest(metadata: PhoneMetadata | None) -> int:
    desc = metadata.general_desc if metadata is not None else None
    lengths = [n for n in desc.possible_length if n > 0] if desc is not None else []
    return min(lengths, default=1)


def _shortest_prefix(pattern: re.Pattern[str] | None, longest: int = 5) -> int:
    """The fewest digits an international dialling prefix (``011``, ``00``) takes."""
    if pattern is not None:
        for length in range(1, longest + 1):
            if any(pattern.fullmatch("".join(d)) for d in product(string.digits, repeat=length)):
                return length
    return 0


@cache
def _bounds(region: str) -> tuple[int, int, int, re.Pattern[str] | None]:
    """The fewest digits of a number valid for libphonenumber in a candidate with a plus
    sign; in one without, where the region's dialling prefix may start an international
    number (country code and national number) or a national number of ``region``; in one
    where it cannot, a national number. Then the region's dialling prefix."""
    international = min(
        [
            len(str(code)) + _shortest(PhoneMetadata.metadata_for_region(name))
            for name in phonenumbers.SUPPORTED_REGIONS
            if (code := phonenumbers.country_code_for_region(name))
        ]
        + [
            len(str(code)) + _shortest(PhoneMetadata.metadata_for_nongeo_region(code))
            for code in phonenumbers.COUNTRY_CODES_FOR_NON_GEO_REGIONS
        ]
    )
    metadata = PhoneMetadata.metadata_for_region(region)
    national = _shortest(metadata)
    pattern = metadata.international_prefix if metadata is not None else None
    prefix = re.compile(pattern) if pattern else None
    dialled = min(national, _shortest_prefix(prefix) + international)
    return min(national, international), dialled, national, prefix


class Phones:
    """libphonenumber's matcher, numbers valid for their region only (not digit runs)."""

    def __init__(self, region: str) -> None:
        self.region = region
        bounds = _bounds(region)
        self.fewest_digits, self.fewest_without_plus, self.fewest_national = bounds[:3]
        self._dialling_prefix = bounds[3]

    def _fewest(self, plus: bool, digits: str) -> int:
        """With a plus sign, with the region's dialling prefix anywhere in the digits (the
        matcher also tries parts of a candidate), or neither: then only a national number."""
        if plus:
            return self.fewest_digits
        prefix = self._dialling_prefix
        if prefix is None or not digits.isascii() or prefix.search(digits):
            return self.fewest_without_plus
        return self.fewest_national

    def _enough_in(self, text: str) -> bool:
        """``text`` holds as many digits as a number in it needs: a text's digits hold every
        candidate's in it, and its bound is at most theirs (a plus or prefix in it)."""
        digits = "".join(filter(str.isdigit, text))
        return len(digits) >= self._fewest("+" in text or "\uff0b" in text, digits)

    def _may_hold_one(self, text: str) -> bool:
        """The matcher is slow (200 µs a URL with ids): it runs only where one of its own
        candidates holds enough digits (test_pii.py::test_phones_gate_is_exact)."""
        if _CANDIDATES is None:  # nor is the runs' character set known then
            return self._enough_in(text)
        if text.isascii():  # 1 µs: the candidate pattern's scan is 12 µs a URL with a UUID
            fewest, plus = self.fewest_digits, "+" in text
            for run in _digit_runs(text):  # a loop: any() and its generator cost 0.5 µs more
                if len(run) >= fewest and len(run) >= self._fewest(plus, run.decode()):
                    break
            else:
                return False
        elif not self._enough_in(text):
            return False
        return any(self._enough_in(m.group()) for m in _CANDIDATES.finditer(text))

    def __call__(self, text: str) -> list[Span]:
        if _GATED and not self._may_hold_one(text):
            return []
        leniency = phonenumbers.Leniency.VALID
        found: list[Span] = []
        for m in phonenumbers.PhoneNumberMatcher(text, self.region, leniency=leniency):
            e164 = phonenumbers.format_number(m.number, phonenumbers.PhoneNumberFormat.E164)
            found.append((m.start, m.end, e164))
        return found


def regex_detector(pattern: re.Pattern[str]) -> Detector:
    """A custom pattern (AC_PII_PATTERNS): its first group if it has one, else the match."""
    group = 1 if pattern.groups else 0

    def detect(text: str) -> Iterator[Span]:
        for m in pattern.finditer(text):
            if m.group(group):
                yield m.start(group), m.end(group), m.group(group)

    return detect


# In order: a later detector runs on the text with the earlier ones' placeholders in,
# so cards go before phones (a card holds phone-like runs) and secrets before all.
BUILT_IN: list[tuple[str, Detector]] = [
    ("SECRET", secrets),
    ("EMAIL", emails),
    ("IBAN", ibans),
    ("CARD", cards),
    ("SSN", ssns),
    ("IP", ip_addresses),
]
