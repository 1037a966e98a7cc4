# Chinese finance documents group thousands with commas (Django's zh_Hans leaves grouping off).
THOUSAND_SEPARATOR = ","
NUMBER_GROUPING = 3
