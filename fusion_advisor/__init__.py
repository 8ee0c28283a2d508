"""fusion-advisor: which chains of a PyTorch model to fuse, how, and what it buys.

Pipeline stages, one module each, passing the typed records of :mod:`fusion_advisor.records`:

    load -> capture -> graph -> chains -> route (rules, devices) -> report
                                         \\-> apply -> verify -> bench

See README.md for the commands.
"""

__version__ = "0.1.0"
