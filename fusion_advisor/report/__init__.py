"""report: what analyze (and apply) found, as a folder a person reads and a program reads back.

:mod:`~fusion_advisor.report.write` renders and writes report.html, chains.csv, ops.csv and report.json (and reads
them back); :mod:`~fusion_advisor.report.views` computes what the page shows first, :mod:`~fusion_advisor.report.charts`
its pictures; :mod:`~fusion_advisor.report.diff` puts two report folders side by side.
"""
