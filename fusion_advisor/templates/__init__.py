"""Jinja2 templates of the report stage (``report.html.j2``), read with :mod:`importlib.resources`."""
