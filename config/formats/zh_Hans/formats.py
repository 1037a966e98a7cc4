# Chinese finance documents group thousands with commas (Django's zh_Hans leaves grouping off).
THOUSAND_SEPARATOR = ","
NUMBER_GROUPING = 3

# One date format per language (config/formats/en/formats.py has the English ones and the reason).
DATE_FORMAT = "Y年n月j日"
DATETIME_FORMAT = "Y年n月j日 H:i"
TIME_FORMAT = "H:i:s"
YEAR_MONTH_FORMAT = "Y年n月"
MONTH_DAY_FORMAT = "n月j日"
SHORT_DATE_FORMAT = "Y年n月j日"
SHORT_DATETIME_FORMAT = "Y年n月j日 H:i"
