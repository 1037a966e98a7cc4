# One date format per language across the product (pages, PDFs use their own): English shows dates
# ISO-like, as the CSVs, the period inputs and finance systems write them, so a page never mixes
# "Dec. 1, 2026" with "2026-12-01". Templates name these formats ("DATE_FORMAT", …), never a pattern.
DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i"
# Seconds where they matter (the audit log, upload windows): `|time:"TIME_FORMAT"`.
TIME_FORMAT = "H:i:s"
YEAR_MONTH_FORMAT = "Y-m"
MONTH_DAY_FORMAT = "m-d"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
