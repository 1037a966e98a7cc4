"""ISO 4217: the one list of currencies a price or a budget may be in, with each one's minor unit.

Pure (no database). `MINOR_UNITS` maps every active ISO 4217 currency code (List One) to its
number of minor-unit decimals. Fund codes (BOV, CHE, CHW, CLF, COU, MXV, USN, UYI, UYW),
precious metals (XAU, XAG, XPD, XPT), the SDR and settlement units (XDR, XSU, XUA, XBA…XBD)
and the testing codes (XTS, XXX) are left out: none of them is money a GPU is priced in.
Codes withdrawn by the end of 2026 (HRK, SLL, ZWL, ANG, BGN, CUC) are left out too; a record
that still carries one keeps it, but no form or service accepts it for a new or changed record.

`billing.money` rounds with these minor units; forms offer `CURRENCY_CHOICES`; services call
`check_currency`, so a form, the API and a management command refuse the same codes with the
same message.
"""

from __future__ import annotations

from django.utils.translation import gettext as _

from billing.errors import InvalidInput

__all__ = ["CURRENCY_CHOICES", "MINOR_UNITS", "check_currency"]

_ZERO = ("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "VND", "VUV", "XAF",
         "XOF", "XPF")
_THREE = ("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND")
_TWO = (
    "AED", "AFN", "ALL", "AMD", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT", "BMD", "BND", "BOB",
    "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD", "CDF", "CHF", "CNY", "COP", "CRC", "CUP", "CVE", "CZK",
    "DKK", "DOP", "DZD", "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GTQ",
    "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IRR", "JMD", "KES", "KGS", "KHR", "KPW", "KYD",
    "KZT", "LAK", "LBP", "LKR", "LRD", "LSL", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR",
    "MVR", "MWK", "MXN", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "PAB", "PEN", "PGK", "PHP",
    "PKR", "PLN", "QAR", "RON", "RSD", "RUB", "SAR", "SBD", "SCR", "SDG", "SEK", "SGD", "SHP", "SLE", "SOS",
    "SRD", "SSP", "STN", "SVC", "SYP", "SZL", "THB", "TJS", "TMT", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH",
    "USD", "UYU", "UZS", "VED", "VES", "WST", "XCD", "XCG", "YER", "ZAR", "ZMW", "ZWG",
)

MINOR_UNITS: dict[str, int] = dict(
    sorted({**dict.fromkeys(_TWO, 2), **dict.fromkeys(_ZERO, 0), **dict.fromkeys(_THREE, 3)}.items())
)

# A select's options: the code is the same in every language, so it is its own label.
CURRENCY_CHOICES: list[tuple[str, str]] = [(code, code) for code in MINOR_UNITS]


def check_currency(value: str) -> str:
    """`value` as an ISO 4217 code of `MINOR_UNITS` (upper-cased, trimmed), else `InvalidInput`."""
    code = value.strip().upper()
    if code not in MINOR_UNITS:
        raise InvalidInput(
            _("currency %(code)r is not an ISO 4217 currency code this service accepts (such as USD, EUR, CNY, JPY)")
            % {"code": value.strip()}
        )
    return code
