"""Lacuna workflows: the testbed chain, filter, resurfacing and locality (``chain``) and the localization-precision
run (``localization``)."""
